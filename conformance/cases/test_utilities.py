"""Catalog section "Utilities" (the rows that need no training objects).

Constants, enums, environment helpers, environment checks, the environment
defaults of the ``Accelerator`` and the ``cpu`` flag, all on one process.
``config.write_basic_config`` and the ``modeling.*`` rows are not covered
here yet. Every case that touches ``os.environ`` restores it itself (not
with the implementation's helpers, which are under test).

Where a documented name is missing, the case uses it the way a script would
and lets the AttributeError through (an ERROR); wrong values and untruthful
answers are assertions (a FAIL). Present names are checked first, so an
implementation that lacks one name still has everything else checked.
"""

from __future__ import annotations

import importlib
import importlib.metadata
import importlib.util
import os
import sys
from contextlib import contextmanager
from typing import Iterator

from ..engine.case import case
from ..support.checks import expect_equal, expect_raises, expect_true


@contextmanager
def _environ(**changes: str | None) -> Iterator[None]:
    """Set (or, for None, remove) variables for the block; restore the whole environment after."""
    saved = dict(os.environ)
    try:
        for key, value in changes.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
        yield
    finally:
        os.environ.clear()
        os.environ.update(saved)


def _missing(owner, names, where: str) -> None:
    """Raise AttributeError naming every documented name ``owner`` lacks (an ERROR, as in a script using it)."""
    absent = [name for name in names if not hasattr(owner, name)]
    if absent:
        raise AttributeError(f"documented names missing from {where}: {', '.join(absent)}")


# -- constants -------------------------------------------------------------------

CONSTANTS = {
    "MODEL_NAME": "pytorch_model",
    "OPTIMIZER_NAME": "optimizer",
    "RNG_STATE_NAME": "random_states",
    "SCALER_NAME": "scaler.pt",
    "SCHEDULER_NAME": "scheduler",
    "WEIGHTS_NAME": "pytorch_model.bin",
    "SAFE_WEIGHTS_NAME": "model.safetensors",
    "WEIGHTS_INDEX_NAME": "pytorch_model.bin.index.json",
    "SAFE_WEIGHTS_INDEX_NAME": "model.safetensors.index.json",
}


@case("constants.names", worlds=[1])
def constants_names(impl, world):
    """``utils.MODEL_NAME`` ... ``utils.SAFE_WEIGHTS_INDEX_NAME`` have their documented values."""
    utils = impl.utils
    present = {name: getattr(utils, name) for name in CONSTANTS if hasattr(utils, name)}
    expect_equal(present, {name: value for name, value in CONSTANTS.items() if name in present}, "utils constants")
    _missing(utils, CONSTANTS, "utils")


# -- enums -----------------------------------------------------------------------

#: Documented members of each enum (utilities reference), in documented order.
ENUM_MEMBERS = {
    "ComputeEnvironment": ["LOCAL_MACHINE", "AMAZON_SAGEMAKER"],
    "DistributedType": ["NO", "MULTI_CPU", "MULTI_GPU", "MULTI_NPU", "MULTI_XPU", "DEEPSPEED", "TPU"],
    "DynamoBackend": [
        "NO", "EAGER", "AOT_EAGER", "INDUCTOR", "AOT_TS_NVFUSER", "NVPRIMS_NVFUSER", "CUDAGRAPHS",
        "OFI", "FX2TRT", "ONNXRT", "TENSORRT", "IPEX", "TVM",
    ],
    "LoggerType": ["ALL", "TENSORBOARD", "WANDB", "COMETML", "DVCLIVE"],
    "PrecisionType": ["NO", "FP16", "BF16"],
    "RNGType": ["TORCH", "CUDA", "XLA", "GENERATOR"],
    "SageMakerDistributedType": ["NO", "DATA_PARALLEL", "MODEL_PARALLEL"],
}

#: Values the documents give (the strings users pass: ``mixed_precision="bf16"``,
#: ``log_with="tensorboard"``, ``rng_types=["torch"]``).
ENUM_VALUES = {
    "PrecisionType": {"NO": "no", "FP16": "fp16", "BF16": "bf16"},
    "LoggerType": {"ALL": "all", "TENSORBOARD": "tensorboard", "WANDB": "wandb", "COMETML": "comet_ml", "DVCLIVE": "dvclive"},
    "RNGType": {"TORCH": "torch", "CUDA": "cuda", "XLA": "xla", "GENERATOR": "generator"},
}


@case("enums.values", worlds=[1])
def enums_values(impl, world):
    """DistributedType, PrecisionType, RNGType, LoggerType, DynamoBackend, ComputeEnvironment and
    SageMakerDistributedType have their documented members; where the documents give the strings
    users pass (precision, logger, RNG names), each member has that value and is found by it
    (``PrecisionType("bf16") is PrecisionType.BF16``). ``accelerate.DistributedType`` is ``accelerate.utils.DistributedType``.
    """
    utils = impl.utils
    problems = []
    for enum_name, values in ENUM_VALUES.items():
        enum = getattr(utils, enum_name)
        for member_name, value in values.items():
            member = getattr(enum, member_name, None)
            if member is None:
                continue
            if member.value != value or enum(value) is not member:
                problems.append(f"{enum_name}.{member_name}: value {member.value!r}, expected {value!r} (and found by it)")
    expect_equal(problems, [], "enum members whose value is not the documented string")
    expect_true(impl.DistributedType is utils.DistributedType, "accelerate.DistributedType should be accelerate.utils.DistributedType")
    absent = [f"{e}.{m}" for e, members in ENUM_MEMBERS.items() for m in members if not hasattr(getattr(utils, e), m)]
    if absent:
        raise AttributeError(f"documented enum members missing: {', '.join(absent)}")


# -- environment helpers -----------------------------------------------------------


@case("env.patch_environment", worlds=[1])
def env_patch_environment(impl, world):
    """``patch_environment(foo="bar")`` sets ``FOO`` (name upper-cased, value str-converted) inside the
    block and removes it on exit; a variable that existed before gets its old value back, also when
    the block raises."""
    patch_environment = impl.utils.patch_environment
    new, old = "CONFORMANCE_PATCH_NEW", "CONFORMANCE_PATCH_OLD"
    with _environ(**{new: None, old: "before", new.lower(): None}):
        with patch_environment(conformance_patch_new=3, CONFORMANCE_PATCH_OLD=2.5):
            inside = (os.environ.get(new), os.environ.get(new.lower()), os.environ.get(old))
        expect_equal(inside, ("3", None, "2.5"), f"({new}, {new.lower()}, {old}) inside patch_environment")
        expect_equal((os.environ.get(new), os.environ.get(old)), (None, "before"), f"({new}, {old}) after patch_environment")

        def raise_inside():
            with patch_environment(conformance_patch_new="x", conformance_patch_old="y"):
                raise KeyError("raised inside the block")

        expect_raises(raise_inside, KeyError, "an exception raised inside patch_environment")
        expect_equal(
            (os.environ.get(new), os.environ.get(old)), (None, "before"), f"({new}, {old}) after a block that raised"
        )


@case("env.clear_environment", worlds=[1])
def env_clear_environment(impl, world):
    """Inside ``clear_environment()`` ``os.environ`` is empty; on exit the old environment is back
    exactly, and what the block set or changed is discarded (also when it raises)."""
    clear_environment = impl.utils.clear_environment
    with _environ(CONFORMANCE_CLEAR_OLD="bar", CONFORMANCE_CLEAR_NEW=None):
        before = dict(os.environ)
        with clear_environment():
            inside = dict(os.environ)
            os.environ["CONFORMANCE_CLEAR_OLD"] = "new_bar"
            os.environ["CONFORMANCE_CLEAR_NEW"] = "x"
            changed = os.environ.get("CONFORMANCE_CLEAR_OLD")
        after = dict(os.environ)
        expect_equal(inside, {}, "os.environ inside clear_environment()")
        expect_equal(changed, "new_bar", "a variable set inside clear_environment() reads back inside")
        expect_equal(after.get("CONFORMANCE_CLEAR_OLD"), "bar", "CONFORMANCE_CLEAR_OLD after clear_environment()")
        expect_true("CONFORMANCE_CLEAR_NEW" not in after, "a variable added inside clear_environment() must be gone after it")
        expect_true(after == before, "the environment after clear_environment() should equal the one before")

        def raise_inside():
            with clear_environment():
                os.environ["CONFORMANCE_CLEAR_NEW"] = "x"
                raise KeyError("raised inside the block")

        expect_raises(raise_inside, KeyError, "an exception raised inside clear_environment")
        expect_true(dict(os.environ) == before, "the environment after a clear_environment() block that raised should equal the one before")


# -- environment checks --------------------------------------------------------------

#: ``is_<name>_available`` -> the import names whose presence it reports.
PACKAGE_CHECKS = {
    "is_datasets_available": ["datasets"],
    "is_deepspeed_available": ["deepspeed"],
    "is_peft_available": ["peft"],
    "is_transformers_available": ["transformers"],
    "is_torchvision_available": ["torchvision"],
    "is_torchdata_available": ["torchdata"],
    "is_bnb_available": ["bitsandbytes"],
    "is_msamp_available": ["msamp"],
    "is_transformer_engine_available": ["transformer_engine"],
    "is_tensorboard_available": ["tensorboard", "tensorboardX"],
    "is_wandb_available": ["wandb"],
    "is_comet_ml_available": ["comet_ml"],
    "is_mlflow_available": ["mlflow"],
    "is_clearml_available": ["clearml"],
    "is_dvclive_available": ["dvclive"],
}

#: Stand-in packages (an importable module with distribution metadata) put on
#: ``sys.path`` for the case, so that "installed" is checked as well as "absent".
STAND_INS = ("comet_ml", "dvclive")


def _found(*modules: str) -> bool:
    return any(importlib.util.find_spec(module) is not None for module in modules)


@contextmanager
def _stand_in_packages(directory: str, names) -> Iterator[None]:
    """Make ``names`` installed for the block: a package and its ``.dist-info`` on ``sys.path``."""
    for name in names:
        os.makedirs(os.path.join(directory, name), exist_ok=True)
        with open(os.path.join(directory, name, "__init__.py"), "w") as handle:
            handle.write('"""Stand-in package for the conformance suite."""\n__version__ = "0.0.1"\n')
        info = os.path.join(directory, f"{name}-0.0.1.dist-info")
        os.makedirs(info, exist_ok=True)
        with open(os.path.join(info, "METADATA"), "w") as handle:
            handle.write(f"Metadata-Version: 2.1\nName: {name}\nVersion: 0.0.1\n")
    sys.path.insert(0, directory)
    importlib.invalidate_caches()
    try:
        yield
    finally:
        sys.path.remove(directory)
        importlib.invalidate_caches()


@case("env.checks", worlds=[1])
def env_checks(impl, world):
    """``is_torch_version``, ``is_cuda_available``, ``is_bf16_available``, the device checks and the
    ``is_<package>_available`` checks answer truthfully on this machine.

    Versions are compared with the installed torch's metadata; devices with what torch itself
    reports; packages with ``importlib.util.find_spec`` (truthiness: None counts as False), both
    for absent packages and for stand-in packages installed on ``sys.path`` for the case. The
    documented ``is_tpu_available`` and ``is_ipex_available`` are checked last.
    """
    import torch

    utils = impl.utils
    problems = []

    def check(what: str, got, expected: bool) -> None:
        if bool(got) != expected:
            problems.append(f"{what} returned {got!r}, expected {expected}")

    installed = importlib.metadata.version("torch")
    check('is_torch_version(">=", "2.0")', utils.is_torch_version(">=", "2.0"), True)
    check('is_torch_version("<", "2.0")', utils.is_torch_version("<", "2.0"), False)
    check(f'is_torch_version("==", "{installed}")', utils.is_torch_version("==", installed), True)
    check(f'is_torch_version(">", "{installed}")', utils.is_torch_version(">", installed), False)
    check(f'is_torch_version("<=", "{installed}")', utils.is_torch_version("<=", installed), True)

    cuda = torch.cuda.is_available()
    mps = torch.backends.mps.is_available() and torch.backends.mps.is_built()
    xpu = hasattr(torch, "xpu") and torch.xpu.is_available()
    check("is_cuda_available()", utils.is_cuda_available(), cuda)
    check("is_mps_available()", utils.is_mps_available(), mps)
    check("is_xpu_available()", utils.is_xpu_available(), xpu)
    if not _found("torch_npu"):
        check("is_npu_available() without torch_npu", utils.is_npu_available(), False)
    if cuda:
        check("is_bf16_available() on CUDA", utils.is_bf16_available(), torch.cuda.is_bf16_supported())
    elif not (mps or xpu or _found("torch_xla", "torch_npu", "torch_mlu")):
        check("is_bf16_available() on a CPU-only machine", utils.is_bf16_available(), True)

    for function, modules in PACKAGE_CHECKS.items():
        if hasattr(utils, function):
            check(f"{function}() (find_spec: {_found(*modules)})", getattr(utils, function)(), _found(*modules))
    with _stand_in_packages(os.path.join(world.shared_dir, "site"), STAND_INS):
        for name in STAND_INS:
            expect_true(_found(name), f"the stand-in package {name} should be importable")
            function = f"is_{name}_available"
            if hasattr(utils, function):
                check(f"{function}() with a stand-in {name} installed", getattr(utils, function)(), True)
    expect_equal(problems, [], "environment checks that answered untruthfully")

    _missing(utils, ["is_tpu_available", "is_ipex_available"], "utils")
    if not _found("torch_xla"):
        check("is_tpu_available() without torch_xla", utils.is_tpu_available(), False)
    check("is_ipex_available()", utils.is_ipex_available(), _found("intel_extension_for_pytorch"))
    expect_equal(problems, [], "environment checks that answered untruthfully")


# -- Accelerator environment defaults ---------------------------------------------------


@case("mixed_precision.env_default", worlds=[1])
def mixed_precision_env_default(impl, world):
    """With no argument, ``mixed_precision`` comes from ``ACCELERATE_MIXED_PRECISION`` and
    ``gradient_accumulation_steps`` from ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS``."""
    with _environ(ACCELERATE_MIXED_PRECISION="bf16", ACCELERATE_GRADIENT_ACCUMULATION_STEPS="2"):
        acc = impl.Accelerator()
        expect_equal(str(acc.mixed_precision), "bf16", "accelerator.mixed_precision with ACCELERATE_MIXED_PRECISION=bf16")
        expect_equal(str(acc.state.mixed_precision), "bf16", "accelerator.state.mixed_precision")
        expect_equal(
            acc.gradient_accumulation_steps, 2, "accelerator.gradient_accumulation_steps with ACCELERATE_GRADIENT_ACCUMULATION_STEPS=2"
        )


@case("mixed_precision.env_default", worlds=[1])
def mixed_precision_argument_wins(impl, world):
    """The environment is only the default: ``Accelerator(mixed_precision="no")`` is "no" even with
    ``ACCELERATE_MIXED_PRECISION=bf16``; without the variables the defaults are "no" and 1."""
    with _environ(ACCELERATE_MIXED_PRECISION="bf16"):
        acc = impl.Accelerator(mixed_precision="no")
        expect_equal(str(acc.mixed_precision), "no", 'Accelerator(mixed_precision="no") with ACCELERATE_MIXED_PRECISION=bf16')


@case("mixed_precision.env_default", worlds=[1])
def mixed_precision_unset_defaults(impl, world):
    """Without ``ACCELERATE_MIXED_PRECISION`` and ``ACCELERATE_GRADIENT_ACCUMULATION_STEPS`` the
    defaults are "no" and 1 (so the other cases see the variables, not a fixed answer)."""
    with _environ(ACCELERATE_MIXED_PRECISION=None, ACCELERATE_GRADIENT_ACCUMULATION_STEPS=None):
        acc = impl.Accelerator()
        expect_equal(str(acc.mixed_precision), "no", "accelerator.mixed_precision without ACCELERATE_MIXED_PRECISION")
        expect_equal(acc.gradient_accumulation_steps, 1, "gradient_accumulation_steps without the variable")


# -- cpu flag ----------------------------------------------------------------------------


@case("cpu.flag", worlds=[1])
def cpu_flag(impl, world):
    """``Accelerator(cpu=True)`` uses the CPU even where an accelerator exists, with no help from
    ``ACCELERATE_USE_CPU`` (removed from the environment for the case): the device, the state's
    device and a tensor the Accelerator reduces all live on the CPU."""
    import torch

    with _environ(ACCELERATE_USE_CPU=None):
        acc = impl.Accelerator(cpu=True)
        expect_equal(acc.device.type, "cpu", "Accelerator(cpu=True).device.type")
        expect_equal(acc.state.device.type, "cpu", "Accelerator(cpu=True).state.device.type")
        reduced = acc.reduce(torch.ones(2).to(acc.device), reduction="sum")
        expect_equal(reduced.device.type, "cpu", "device of a tensor reduced by Accelerator(cpu=True)")
        distributed = str(acc.distributed_type).split(".")[-1]
        expect_true(distributed in ("NO", "MULTI_CPU"), f"distributed_type with cpu=True: expected NO or MULTI_CPU, got {distributed}")

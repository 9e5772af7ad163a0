"""Meta-tests of the real-tracker cases of ``tracking.init_log_end`` (MLflow, W&B offline; Comet, Aim, ClearML, DVCLive).

The machinery is `support`'s. The cases run only where their
package is installed (extra ``trackers``); elsewhere they are NOT_SUPPORTED
and these entries are skipped. A break is caught when the tracker's own
store, read back, differs from what the rule says it holds.

To reproduce one break by hand::

    PYTHONPATH=tests/conformance/meta python -m conformance run --impl broken_impls.tracking_mlflow_drops_step --worlds 2 -k 'tracking.*' --no-manifest
"""

from __future__ import annotations

import importlib.util

import pytest

from tests.conformance.meta.support import Break, E, F, brk, judge, plan

pytestmark = [pytest.mark.slow, pytest.mark.timeout(600)]

#: The real-tracker cases, by the package each needs.
CASES = {"tracking_mlflow": "mlflow", "tracking_wandb": "wandb",
         # extra trackers-more (not installed by CI)
         "tracking_comet_ml": "comet_ml", "tracking_aim": "aim", "tracking_clearml": "clearml", "tracking_dvclive": "dvclive"}
INSTALLED = tuple(name for name, package in CASES.items() if importlib.util.find_spec(package) is not None)

BREAKS = [
    brk("tracking_mlflow_drops_step", {"tracking_mlflow": F}, "2", ("tracking_mlflow",)),
    # Every process logs as if it were the main one: W&B gets a second run. MLflowTracker's own
    # methods run on the main process only, so rank 1's tracker never starts and, as HF's, has no run to
    # unwrap: its case errors (test_saving has the custom-tracker case).
    brk("save_tracker_on_every_rank", {"tracking_wandb": F, "tracking_mlflow": E}, "2", INSTALLED),
    # The configuration never reaches the store: each case reads its package's store back.
    brk("tracking_more_drops_config",
        {"tracking_comet_ml": F, "tracking_aim": F, "tracking_clearml": F, "tracking_dvclive": F}, "2",
        ("tracking_comet_ml", "tracking_aim", "tracking_clearml", "tracking_dvclive")),
]

#: Only the breaks whose cases can run here (with the reference's control first).
PLAN = plan([b for b in BREAKS if set(b.caught) <= set(INSTALLED)])


@pytest.mark.parametrize("entry", PLAN, ids=lambda entry: entry.label)
def test_suite_reports_tracker_breaks(entry: Break, request) -> None:
    # The judgement of `support.judge`, on this module's entries and pool.
    judge(entry, request)

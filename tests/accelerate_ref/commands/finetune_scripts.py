"""The fine-tune recipes' training scripts and settings, as plain strings and dicts, and the local model they train
(no project import): the dry-run tests (``test_dry_run_finetune.py``, ``test_dry_run_trainer.py``) run them on mock
GPUs, ``benchmarks/finetune_gpu.py`` on a real one."""

import textwrap

RANK = 8
TARGETS = ("q_proj", "v_proj")
#: Two decoder shapes, as saved locally from configs (no download).
SHAPES = {
    "llama": ("LlamaConfig", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                  num_key_value_heads=2, vocab_size=512)),
    "qwen": ("Qwen2Config", dict(hidden_size=128, intermediate_size=256, num_hidden_layers=2, num_attention_heads=4,
                                 num_key_value_heads=2, vocab_size=512)),
}
#: Each recipe's quantization (None: a full-precision base) and whether it checkpoints activations.
RECIPES = {
    "lora": (None, False),
    "lora-checkpointing": (None, True),
    "qlora-nf4": ("dict(load_in_4bit=True, bnb_4bit_quant_type='nf4', bnb_4bit_use_double_quant=True, "
                  "bnb_4bit_compute_dtype=torch.bfloat16)", True),
    "qlora-fp4": ("dict(load_in_4bit=True, bnb_4bit_quant_type='fp4', bnb_4bit_compute_dtype=torch.bfloat16)", True),
    "lora-8bit": ("dict(load_in_8bit=True)", True),
}

SCRIPT = textwrap.dedent("""\
    import sys

    import torch
    from accelerate import Accelerator
    from peft import LoraConfig, get_peft_model, prepare_model_for_kbit_training
    from transformers import AutoModelForCausalLM, BitsAndBytesConfig

    folder = sys.argv[1]
    accelerator = Accelerator()
    quantization = {quantization}
    if quantization is not None:
        model = AutoModelForCausalLM.from_pretrained(folder, quantization_config=BitsAndBytesConfig(**quantization),
                                                     device_map={{"": accelerator.local_process_index}}, dtype=torch.bfloat16)
        model = prepare_model_for_kbit_training(model, use_gradient_checkpointing={checkpointing})
    else:
        model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
        if {checkpointing}:
            model.gradient_checkpointing_enable()
            model.enable_input_require_grads()
    model = get_peft_model(model, LoraConfig(r={rank}, target_modules={targets}))
    optimizer = torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=1e-4)
    tokens = torch.randint(0, model.config.vocab_size, (8, 32))
    loader = torch.utils.data.DataLoader(torch.utils.data.TensorDataset(tokens), batch_size=2)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    for (batch,) in loader:
        loss = model(input_ids=batch, labels=batch).loss
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
    print("trained", type(accelerator.unwrap_model(model)).__name__, flush=True)
    if torch.cuda.is_available():
        print("peaks", accelerator.process_index, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), flush=True)
    """)

#: The Transformers ``Trainer`` recipe: a full fine-tune, gradient checkpointing, two steps of two rows a rank; its
#: distribution set as users set it, in ``TrainingArguments`` (FSDP2, or a DeepSpeed config dict).
ZERO_CONFIG = {"train_micro_batch_size_per_gpu": "auto", "gradient_accumulation_steps": "auto", "train_batch_size": "auto",
               "gradient_clipping": "auto"}
TRAINER_SETUPS = {
    "ddp": {},
    "fsdp2": {"fsdp": "full_shard auto_wrap", "fsdp_config": {"version": 2}},
    "zero2": {"deepspeed": {**ZERO_CONFIG, "zero_optimization": {"stage": 2}}},
    "zero3": {"deepspeed": {**ZERO_CONFIG, "zero_optimization": {"stage": 3}}},
}
TRAINER_SCRIPT = textwrap.dedent("""\
    import sys

    import torch
    from transformers import AutoModelForCausalLM, Trainer, TrainingArguments

    folder = sys.argv[1]


    class Rows(torch.utils.data.Dataset):
        def __len__(self):
            return 8

        def __getitem__(self, index):
            tokens = torch.randint(0, 512, (32,))
            return {{"input_ids": tokens, "labels": tokens}}


    arguments = TrainingArguments(output_dir="out", per_device_train_batch_size=2, max_steps=2, report_to=[],
                                  save_strategy="no", gradient_checkpointing=True, **{options})
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    Trainer(model=model, args=arguments, train_dataset=Rows()).train()
    print("trained", type(model).__name__, flush=True)
    if torch.cuda.is_available():
        print("peaks", torch.distributed.get_rank() if torch.distributed.is_initialized() else 0,
              torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(), flush=True)
    """)

#: TRL's ``SFTTrainer`` recipe: LoRA on the base (``peft_config``), bf16, text rows its own tokenizer reads.
SFT_SCRIPT = textwrap.dedent("""\
    import sys

    import torch
    from datasets import Dataset
    from peft import LoraConfig
    from trl import SFTConfig, SFTTrainer

    folder = sys.argv[1]
    rows = Dataset.from_list([{{"text": " ".join(f"w{{(row * 7 + word) % 500}}" for word in range(24))}} for row in range(16)])
    config = SFTConfig(output_dir="out", per_device_train_batch_size=2, max_steps=2, report_to=[], save_strategy="no",
                       bf16=True, max_length=32)
    trainer = SFTTrainer(model=folder, args=config, train_dataset=rows,
                         peft_config=LoraConfig(r={rank}, target_modules={targets}, task_type="CAUSAL_LM"))
    trainer.train()
    print("trained", type(trainer.model).__name__, flush=True)
    if torch.cuda.is_available():
        print("peaks", trainer.accelerator.process_index, torch.cuda.max_memory_allocated(), torch.cuda.max_memory_reserved(),
              flush=True)
    """)
#: The words of the local tokenizer an SFT recipe's model folder holds (``w0`` ... ``w507`` and four specials).
WORDS = 508


def save_model(folder, shape: str = "llama") -> None:
    """The ``shape`` decoder saved in ``folder`` from its config (seed 0), with a local word-level tokenizer of
    ``WORDS`` words and four specials (TRL reads one)."""
    import torch
    import transformers
    from tokenizers import Tokenizer, models, pre_tokenizers

    config_class, config = SHAPES[shape]
    torch.manual_seed(0)
    model = transformers.AutoModelForCausalLM.from_config(getattr(transformers, config_class)(**config, tie_word_embeddings=False))
    model.save_pretrained(folder)
    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    vocabulary = {f"w{index}": index for index in range(WORDS)} | {word: WORDS + index for index, word in enumerate(specials)}
    words = Tokenizer(models.WordLevel(vocabulary, unk_token="<unk>"))
    words.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, pad_token="<pad>", bos_token="<s>", eos_token="</s>",
                                         unk_token="<unk>").save_pretrained(folder)

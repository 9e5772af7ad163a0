"""The ND setup matrix's script, models and their savers as plain strings and shapes (issue 34), importable with
nothing but the standard library: :mod:`test_dry_run_nd` dry-runs them, and ``benchmarks/nd_world1_gpu.py`` runs the
same script on a real GPU to check the dry run's memory against it."""

import textwrap

#: HF accelerate's ND training loop (``examples/torch_native_parallelism/nd_parallel.py``'s shape): argv is the
#: model folder, dp_replicate, dp_shard, tp and cp sizes, the steps and the decoder layer's class name.
SCRIPT = textwrap.dedent("""\
    import sys

    import torch
    from accelerate import Accelerator
    from accelerate.parallelism_config import ParallelismConfig
    from accelerate.utils import FullyShardedDataParallelPlugin
    from transformers import AutoModelForCausalLM

    folder, sizes = sys.argv[1], [int(size) for size in sys.argv[2:6]]
    config = ParallelismConfig(dp_replicate_size=sizes[0], dp_shard_size=sizes[1], tp_size=sizes[2], cp_size=sizes[3])
    plugin = None
    if config.dp_shard_enabled or config.cp_enabled:
        plugin = FullyShardedDataParallelPlugin(fsdp_version=2, auto_wrap_policy="transformer_based_wrap",
                                                transformer_cls_names_to_wrap=[sys.argv[7]])
    accelerator = Accelerator(mixed_precision="bf16", parallelism_config=config, fsdp_plugin=plugin)
    tensor_parallel = ({"tp_size": config.tp_size, "tp_plan": "auto", "device_mesh": accelerator.torch_device_mesh}
                       if config.tp_enabled else {})
    model = AutoModelForCausalLM.from_pretrained(folder, use_cache=False, **tensor_parallel)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5)
    model, optimizer = accelerator.prepare(model, optimizer)
    for step in range(int(sys.argv[6])):
        ids = torch.randint(0, model.config.vocab_size, (1, 128), device=accelerator.device)
        positions = torch.arange(128, device=accelerator.device).unsqueeze(0)
        buffers = [ids, positions]
        with accelerator.maybe_context_parallel(buffers=buffers, buffer_seq_dims=[1, 1], no_restore_buffers=set(buffers)):
            loss = model(input_ids=ids, labels=ids, position_ids=positions).loss
            accelerator.backward(loss)
            optimizer.step()
            optimizer.zero_grad()
    print("trained", accelerator.distributed_type, flush=True)
    """)


#: DeepSpeed's sequence parallelism (ALST / Ulysses) as HF's ``examples/alst_ulysses_sequence_parallelism/sp-alst.py``
#: drives it (its DeepSpeed config: ZeRO-3, bf16; its fake data set's loop and loss aggregation), through HF 1.15's
#: API: the sp group is DeepSpeed's (HF 1.15 builds no device mesh under DeepSpeed SP, so the example's
#: ``accelerator.torch_device_mesh["sp"]`` is None), the loss is the model's ``loss_function`` on the adapter's
#: ``shift_labels`` (as HF's own ``test_ds_alst_ulysses_sp.py``: Transformers computes no loss without ``labels``), and
#: the data-parallel degree is ``dp_shard_size`` (HF sizes DeepSpeed's batch by ``data_parallel_size``). argv is the
#: model folder, dp_shard, sp, the sequence length and the steps.
SP_SCRIPT = textwrap.dedent("""\
    import sys

    import torch
    from accelerate import Accelerator
    from accelerate.utils import DeepSpeedPlugin, ParallelismConfig
    from accelerate.utils.dataclasses import DeepSpeedSequenceParallelConfig
    from deepspeed.utils import groups
    from transformers import AutoModelForCausalLM

    folder, dp_shard_size, sp_size, seq_length, steps = sys.argv[1], *(int(value) for value in sys.argv[2:6])
    handler = DeepSpeedSequenceParallelConfig(sp_seq_length=seq_length, sp_seq_length_is_variable=True,
                                              sp_attn_implementation="sdpa")
    config = ParallelismConfig(dp_shard_size=dp_shard_size, sp_backend="deepspeed", sp_size=sp_size, sp_handler=handler)
    plugin = DeepSpeedPlugin(hf_ds_config={"bf16": {"enabled": True}, "zero_optimization": {"stage": 3},
                                           "gradient_accumulation_steps": 1, "train_batch_size": "auto",
                                           "train_micro_batch_size_per_gpu": "auto",
                                           "seq_parallel_communication_data_type": "bf16"})
    accelerator = Accelerator(parallelism_config=config, deepspeed_plugin=plugin)
    model = AutoModelForCausalLM.from_pretrained(folder)
    ids = torch.arange(seq_length * steps * accelerator.num_processes).view(-1, seq_length) % model.config.vocab_size
    rows = [{"input_ids": row[None], "position_ids": torch.arange(seq_length)[None], "labels": row[None]} for row in ids]
    loader = torch.utils.data.DataLoader(rows, batch_size=1, collate_fn=lambda batch: batch[0])
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-5)
    model, optimizer, loader = accelerator.prepare(model, optimizer, loader)
    sp_group, unwrapped = groups._get_sequence_parallel_group(), accelerator.unwrap_model(model)
    for step, batch in enumerate(loader):
        batch = {name: value.to(accelerator.device) for name, value in batch.items()}
        logits = model(**batch).logits
        loss = unwrapped.loss_function(logits=logits, labels=None, shift_labels=batch["shift_labels"],
                                       vocab_size=unwrapped.config.vocab_size)
        losses = torch.distributed.nn.functional.all_gather(loss, group=sp_group)
        tokens = torch.distributed.nn.functional.all_gather((batch["shift_labels"] != -100).sum(), group=sp_group)
        loss = sum(part * count for part, count in zip(losses, tokens)) / max(sum(tokens), 1)
        accelerator.backward(loss)
        optimizer.step()
        optimizer.zero_grad()
        if step + 1 == steps:
            break
    print("trained", accelerator.distributed_type, "on", tuple(batch["input_ids"].shape), "tokens", flush=True)
    """)

#: A small Llama whose every split below is even (FSDP2 pads a last shard's parameters, not its optimizer states):
#: hidden 256, MLP 704 (= 64 x 11), 8 heads, vocabulary 1024.
LLAMA = {"hidden_size": 256, "intermediate_size": 704, "num_hidden_layers": 2, "num_attention_heads": 8,
         "num_key_value_heads": 8, "vocab_size": 1024}
#: A Qwen2 of the same size: biased query, key and value projections (split with their weights' rows under tp), 4
#: key-value heads.
QWEN = {**LLAMA, "num_key_value_heads": 4}


SAVE_LLAMA = textwrap.dedent("""\
    import json, sys

    import tokenizers
    import torch
    import transformers

    folder, architecture, shape, words = sys.argv[1], sys.argv[2], json.loads(sys.argv[3]), sys.argv[4].split()
    torch.manual_seed(0)
    model = getattr(transformers, f"{architecture}ForCausalLM")(getattr(transformers, f"{architecture}Config")(**shape))
    model.save_pretrained(folder)
    vocabulary = {word: index for index, word in enumerate(["<unk>", "</s>", *sorted(set(words))])}
    words = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocabulary, unk_token="<unk>"))
    words.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    transformers.PreTrainedTokenizerFast(tokenizer_object=words, unk_token="<unk>", eos_token="</s>").save_pretrained(folder)
    sizes = {name: list(parameter.shape) for name, parameter in model.named_parameters()}
    print(json.dumps({"sizes": sizes, "tp_plan": dict(model.config.base_model_tp_plan)}))
    """)
#: Llama 3 70B's shape (80 layers, hidden 8192, 64 heads over 8 key-value heads, vocabulary 128256).
LLAMA_70B = {"hidden_size": 8192, "intermediate_size": 28672, "num_hidden_layers": 80, "num_attention_heads": 64,
             "num_key_value_heads": 8, "vocab_size": 128256, "max_position_embeddings": 8192, "rope_theta": 500000.0}
#: A Llama checkpoint of holes, as the Hub shards one (bf16 safetensors files of at most 5 GB and their index): each
#: file is its header and the size its tensors take, holding no disk blocks (no-compute ranks read no weight; one
#: 141 GB file would be more than a private mapping may take here). Prints the shapes and the tensor-parallel plan.
SPARSE_LLAMA = textwrap.dedent("""\
    import json, struct, sys

    import torch
    import transformers

    folder, shape = sys.argv[1], json.loads(sys.argv[3])
    config = transformers.LlamaConfig(**shape, torch_dtype="bfloat16")
    with torch.device("meta"):
        model = transformers.LlamaForCausalLM(config)
    config.save_pretrained(folder)
    shards = [[]]
    for name, tensor in model.state_dict().items():
        if shards[-1] and sum(t.numel() * 2 for _, t in shards[-1]) + tensor.numel() * 2 > 5 * 10**9:
            shards.append([])
        shards[-1].append((name, tensor))
    weight_map, total = {}, 0
    for number, shard in enumerate(shards, 1):
        file, header, offset = f"model-{number:05d}-of-{len(shards):05d}.safetensors", {"__metadata__": {"format": "pt"}}, 0
        for name, tensor in shard:
            header[name] = {"dtype": "BF16", "shape": list(tensor.shape), "data_offsets": [offset, offset + tensor.numel() * 2]}
            offset, weight_map[name] = offset + tensor.numel() * 2, file
        text = json.dumps(header).encode()
        text += b" " * (-len(text) % 8)
        with open(f"{folder}/{file}", "wb") as stream:
            stream.write(struct.pack("<Q", len(text)) + text)
            stream.truncate(8 + len(text) + offset)
        total += offset
    with open(f"{folder}/model.safetensors.index.json", "w") as stream:
        json.dump({"metadata": {"total_size": total}, "weight_map": weight_map}, stream)
    sizes = {name: list(parameter.shape) for name, parameter in model.named_parameters()}
    print(json.dumps({"sizes": sizes, "tp_plan": dict(model.config.base_model_tp_plan)}))
    """)
#: The stand-in data set's words (HF's examples read TinyStories): the tokenizer saved with the Llama knows them.
WORDS = "once upon a time there was a little girl named lily she liked to play with her ball in the park"

"""Published runs of hand-written training loops with max_memory_allocated and max_memory_reserved.

Data for scripts/bench_estimator.py (`LOOP_CASES`): every row as its source published it, MiB.
Source: github.com/Anassbzdd/fitcheck, data/measurements/t4-sweep-2026-09-15.json at
1e72b19a3b48fca95c3212141c82ffaaa9ba5752 (the "S" rows; torch 2.14.0+cu130, transformers 5.17.0,
peft 0.20.0, LoRA r 32) and data/measurements/final-t4-20260921.json at
83aea542a90aec3c5bcb435320409bf5dc49b41e (the "F" rows; torch 2.10.0+cu128, transformers 5.0.0,
peft 0.19.1, bitsandbytes 0.50.2, r 16), measured by its scripts/measure.py (read at 02ebe015).
Every row: a Tesla T4; `out = model(input_ids=batch, labels=batch); out.loss.backward();
optimizer.step()` (the output held through the step: loop="custom"); random tokens at full
length, no padding; the model loaded in fp16 with no autocast (4-bit: NF4 without double
quantization, computing in fp16, after peft's k-bit preparation, which casts the embeddings, head
and norms to fp32, so the activations are fp32); LoRA on q, k, v, o with fp32 adapters;
non-reentrant gradient checkpointing; torch.optim.AdamW (foreach); one warm-up step, then one
measured step. "sdpa*" pins SDPA's memory-efficient kernel and repeats the grouped key/value heads
first (not what stock SDPA does on a T4: the math kernel, helpers/estimate/_attention.py).
The source repeated three of its sweep's settings three times each, bit-identical in allocated
memory and within 20 MiB reserved: each appears once here.
"""

SOURCE = (
    "fitcheck T4 archive: github.com/Anassbzdd/fitcheck data/measurements/t4-sweep-2026-09-15.json "
    "@1e72b19a (S rows) and final-t4-20260921.json @83aea542 (F rows); Tesla T4, hand-written loop holding "
    "`out` through backward, fp16 load without autocast, LoRA/QLoRA on q,k,v,o, checkpointing, AdamW; "
    "max_memory_allocated and max_memory_reserved in MiB"
)

# the one model outside the kit's catalog, as the row's own model_config gives it
DEEPSEEK_CODER_1_3B = dict(
    model_type="llama",
    hidden_size=2048,
    num_hidden_layers=24,
    num_attention_heads=16,
    num_key_value_heads=16,
    intermediate_size=5504,
    vocab_size=32256,
    tie_word_embeddings=False,
)
MODELS = {  # the source's model id -> the catalog's name (the same shape) or the config
    "Qwen/Qwen2.5-1.5B-Instruct": "Qwen2.5-1.5B",
    "Qwen/Qwen2.5-Coder-1.5B-Instruct": "Qwen2.5-1.5B",
    "Qwen/Qwen2.5-7B-Instruct": "Qwen2.5-7B",
    "HuggingFaceTB/SmolLM2-135M": "SmolLM2-135M",
    "HuggingFaceTB/SmolLM2-360M": "SmolLM2-360M",
    "HuggingFaceTB/SmolLM2-1.7B": "SmolLM2-1.7B",
    "TinyLlama/TinyLlama-1.1B-Chat-v1.0": "TinyLlama-1.1B",
    "mistralai/Mistral-7B-Instruct-v0.3": "Mistral-7B-v0.3",
    "meta-llama/Llama-3.2-1B-Instruct": "Llama-3.2-1B",
    "meta-llama/Llama-3.2-3B-Instruct": "Llama-3.2-3B",
    "deepseek-ai/deepseek-coder-1.3b-instruct": DEEPSEEK_CODER_1_3B,
}
# (row, model id, method, attention, batch, sequence, LoRA r, after-load allocated, peak allocated, peak reserved)
ROWS = [
    ("S01", "Qwen/Qwen2.5-1.5B-Instruct", "qlora", "eager", 2, 1024, 32, 1643.868, 6838.541, 7548),
    ("S02", "Qwen/Qwen2.5-1.5B-Instruct", "lora", "eager", 2, 1024, 32, 2978.527, 7405.810, 7910),
    ("S03", "Qwen/Qwen2.5-1.5B-Instruct", "qlora", "sdpa*", 2, 1024, 32, 1641.993, 6827.666, 7400),
    ("S04", "Qwen/Qwen2.5-1.5B-Instruct", "lora", "sdpa*", 2, 1024, 32, 2978.527, 7401.810, 7766),
    ("S05", "HuggingFaceTB/SmolLM2-1.7B", "qlora", "eager", 4, 1024, 32, 1296.466, 5297.271, 6996),
    ("S08", "HuggingFaceTB/SmolLM2-1.7B", "lora", "eager", 4, 1024, 32, 3312.192, 6536.748, 7734),
    ("S11", "HuggingFaceTB/SmolLM2-1.7B", "qlora", "sdpa*", 4, 1024, 32, 1296.466, 5281.271, 5940),
    ("S14", "HuggingFaceTB/SmolLM2-1.7B", "lora", "sdpa*", 4, 1024, 32, 3312.192, 6528.748, 7094),
    ("S17", "HuggingFaceTB/SmolLM2-135M", "qlora", "eager", 1, 4096, 32, 179.297, 3679.267, 5224),
    ("S18", "HuggingFaceTB/SmolLM2-135M", "lora", "eager", 1, 4096, 32, 270.653, 3180.107, 4476),
    ("S19", "HuggingFaceTB/SmolLM2-135M", "qlora", "sdpa*", 1, 4096, 32, 179.297, 3576.751, 3784),
    ("S20", "HuggingFaceTB/SmolLM2-135M", "lora", "sdpa*", 1, 4096, 32, 270.653, 3148.107, 3284),
    ("S21", "HuggingFaceTB/SmolLM2-135M", "qlora", "eager", 2, 512, 32, 179.297, 1067.189, 1192),
    ("S22", "HuggingFaceTB/SmolLM2-135M", "lora", "eager", 2, 512, 32, 270.653, 1027.294, 1104),
    ("S23", "HuggingFaceTB/SmolLM2-135M", "qlora", "sdpa*", 2, 512, 32, 179.297, 1063.814, 1194),
    ("S24", "HuggingFaceTB/SmolLM2-135M", "lora", "sdpa*", 2, 512, 32, 270.653, 1026.919, 1070),
    ("S25", "HuggingFaceTB/SmolLM2-360M", "qlora", "eager", 1, 4096, 32, 388.216, 5687.154, 8164),
    ("S26", "HuggingFaceTB/SmolLM2-360M", "lora", "eager", 1, 4096, 32, 729.073, 4908.512, 7304),
    ("S27", "HuggingFaceTB/SmolLM2-360M", "qlora", "sdpa*", 1, 4096, 32, 381.614, 4017.842, 4518),
    ("S28", "HuggingFaceTB/SmolLM2-360M", "lora", "sdpa*", 1, 4096, 32, 729.073, 3754.777, 3912),
    ("S29", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "qlora", "eager", 2, 1024, 32, 1075.553, 2876.335, 3666),
    ("S30", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "lora", "eager", 2, 1024, 32, 2134.552, 3518.084, 4226),
    ("S31", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "qlora", "sdpa*", 2, 1024, 32, 1077.553, 2531.585, 2896),
    ("S32", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "lora", "sdpa*", 2, 1024, 32, 2134.552, 3287.834, 3532),
    ("S33", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "qlora", "eager", 2, 2048, 32, 1070.053, 6650.991, 7840),
    ("S34", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "lora", "eager", 2, 2048, 32, 2134.552, 6616.115, 7662),
    ("S35", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "qlora", "sdpa*", 2, 2048, 32, 1073.553, 3895.866, 4750),
    ("S36", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "lora", "sdpa*", 2, 2048, 32, 2134.552, 4354.115, 4696),
    ("S37", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "qlora", "eager", 2, 512, 32, 1074.053, 1850.319, 2216),
    ("S38", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "lora", "eager", 2, 512, 32, 2134.552, 2757.193, 2908),
    ("S39", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "qlora", "sdpa*", 2, 512, 32, 1077.053, 1849.319, 2054),
    ("S40", "TinyLlama/TinyLlama-1.1B-Chat-v1.0", "lora", "sdpa*", 2, 512, 32, 2134.552, 2756.193, 2880),
    ("F01", "Qwen/Qwen2.5-7B-Instruct", "qlora", "eager", 1, 1024, 16, 7702.368, 10584.768, 11746),
    ("F02", "mistralai/Mistral-7B-Instruct-v0.3", "qlora", "eager", 1, 1024, 16, 4832.626, 6190.584, 6740),
    ("F03", "deepseek-ai/deepseek-coder-1.3b-instruct", "qlora", "eager", 1, 1024, 16, 1202.216, 1975.486, 2274),
    ("F04", "deepseek-ai/deepseek-coder-1.3b-instruct", "qlora", "sdpa*", 1, 1024, 16, 1202.466, 1971.736, 2172),
    ("F05", "mistralai/Mistral-7B-Instruct-v0.3", "qlora", "sdpa*", 1, 1024, 16, 4846.626, 6056.275, 6400),
    ("F06", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "qlora", "sdpa*", 1, 1024, 16, 1632.618, 4235.154, 5212),
    ("F07", "Qwen/Qwen2.5-Coder-1.5B-Instruct", "qlora", "eager", 1, 1024, 16, 1628.306, 4235.779, 5060),
    ("F08", "Qwen/Qwen2.5-7B-Instruct", "qlora", "sdpa*", 1, 1024, 16, 7707.790, 10585.814, 11880),
    ("F09", "meta-llama/Llama-3.2-3B-Instruct", "qlora", "eager", 1, 1024, 16, 3052.265, 5498.535, 6212),
    ("F10", "meta-llama/Llama-3.2-3B-Instruct", "qlora", "sdpa*", 1, 1024, 16, 3052.765, 5495.035, 6268),
    ("F11", "meta-llama/Llama-3.2-1B-Instruct", "qlora", "sdpa*", 1, 1024, 16, 1537.313, 3723.084, 4026),
    ("F12", "meta-llama/Llama-3.2-1B-Instruct", "qlora", "eager", 1, 1024, 16, 1538.313, 3728.084, 4058),
]

VRAMCALC_SOURCE = (
    "vramcalc 0.1.2's validation table (pypi.org/project/vramcalc/0.1.2, README 'Validation'; its repository, "
    "sacom123/vramcalc, is not reachable here): RTX A6000 48 GB, torch 2.14.1+cu130, transformers 4.57.6, "
    "peft 0.21.2, unsloth mirrors of the models; `out = model(input_ids=ids, labels=ids, use_cache=False); "
    "out.loss.backward(); del out; optimizer.step(); optimizer.zero_grad(set_to_none=False)`, foreach AdamW, "
    "LoRA r 16 on q,k,v,o; 'measured' is max_memory_allocated in GB (1e9)"
)
# (row, catalog model, method, "pure" (bf16 weights, no autocast) or "amp" (fp32 weights, bf16 autocast),
#  attention, checkpointing, measured GB); every row 1 x 2048 tokens
VRAMCALC_ROWS = [
    ("V01", "Llama-3.2-1B", "full", "pure", "sdpa", False, 17.51),
    ("V02", "Llama-3.2-1B", "full", "pure", "sdpa", True, 13.76),
    ("V03", "Llama-3.2-1B", "full", "amp", "sdpa", False, 30.55),
    ("V04", "Llama-3.2-1B", "full", "amp", "sdpa", True, 25.22),
    ("V05", "Llama-3.2-1B", "full", "pure", "eager", False, 30.26),
    ("V06", "Llama-3.2-3B", "full", "pure", "sdpa", True, 32.15),
    ("V07", "Qwen2.5-1.5B", "full", "pure", "sdpa", False, 23.40),
    ("V08", "Llama-3.2-1B", "lora", "pure", "sdpa", False, 10.13),
    ("V09", "Llama-3.2-1B", "lora", "amp", "sdpa", False, 14.52),
    ("V10", "Llama-3.2-1B", "lora", "amp", "sdpa", True, 9.51),
    ("V11", "Llama-3.2-3B", "lora", "pure", "sdpa", False, 18.98),
    ("V12", "Llama-3.1-8B", "lora", "pure", "sdpa", True, 20.55),
    ("V13", "Qwen2.5-1.5B", "lora", "pure", "sdpa", False, 13.78),
]

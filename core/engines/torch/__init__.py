"""The torch engine (engine.py: a transformers model in this process, our own decode loop) and its numerics: FP8
(fp8.py, with fp8_cpu.py's C kernel), INT8/INT4/AWQ (quant.py, with int_cpu.py's C dequantization), the CPU fast path
(cpu_fast.py: oneDNN-packed linears) and the small C libraries' build (cbuild.py). Importing this package imports no
torch: its modules do, each when it is imported."""

"""llama.cpp's shared libraries, loaded before anything else that brings C++ code (numpy first).

Seen on an NVIDIA H200 (CUDA 13.0, Python 3.12, numpy 2.5): with numpy, gguf or sentencepiece
imported before llama-cpp-python, `llama_model_load_from_file` died of a segmentation fault in
`llama_model::print_info`, whose `std::ostream` insertion resolved into libggml-cuda.so's own
exported copy of libstdc++'s templates (275 `std::` symbols). llama-cpp-python loads its
libraries with RTLD_GLOBAL, so which copy a symbol binds to depends on what the process loaded
first; loading llama.cpp first, the same process loads, plans and decodes on the GPU. The CPU
build exports no such copy, which is why no CPU run shows it.

Every entry point that may load a model imports this module before anything else (app/cli.py,
scripts/gpu_check.py, scripts/screenshots.py, tests/conftest.py), and tests/test_load_first.py
checks the order with Python's audit hooks.
"""
import llama_cpp  # noqa: F401  (loading the module loads libllama and ggml's libraries)

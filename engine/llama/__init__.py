"""llama.cpp through llama-cpp-python's low-level API: the only package that imports `llama_cpp`."""

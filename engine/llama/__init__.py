"""llama.cpp through llama-cpp-python: the one package of Tandem that imports `llama_cpp`."""

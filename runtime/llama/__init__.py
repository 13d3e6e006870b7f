"""The llama.cpp boundary: the only code that imports llama_cpp."""

"""The engine session over llama_cpp, memory accounting, remote devices and GGUF metadata."""

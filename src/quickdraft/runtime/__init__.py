"""The runtime: forwards (native and Hugging Face's) behind the `Target` protocol, KV caches, CUDA
graphs, CPU kernels, the described model families."""

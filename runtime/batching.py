"""The batching defaults, defined once in a module with no imports, so that
the CLI's option declarations, LoadOptions, the scheduler, the llama.cpp
context and the server's admission share them without slowing start-up."""

SERVE_MAX_NUM_SEQS = 16     # sequences `serve` decodes together (--max-num-seqs)
CPU_STEP_TOKENS = 512       # one step's tokens on a CPU (--max-num-batched-tokens)
GPU_STEP_TOKENS = 2048      # ... with every layer on a GPU, where more costs little
UBATCH_TOKENS = 512         # llama.cpp's n_ubatch: a longer chunk is cut again there
ENGINE_MAX_QUEUE = 256      # requests an engine queues beyond its slots, outside serve
SERVE_MAX_QUEUED = 16384    # requests `serve` admits to wait (--max-queued, admission.py)

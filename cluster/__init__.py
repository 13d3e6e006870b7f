"""`llmctl cluster`: llmctl engine replicas on Ray Serve behind one ingress.
Every module here but affinity.py imports Ray; only `llmctl cluster` loads them."""

"""Starting servers on a deploy output: a Triton Inference Server here or the command one node
runs (server.py), the Slurm and Kubernetes launchers across nodes (cluster.py), a copy of the
repository with other runners (overlay.py), and TensorRT-LLM's LLM-API model files copied into
a pytorch deployment before tritonserver starts (llmapi_model.py)."""

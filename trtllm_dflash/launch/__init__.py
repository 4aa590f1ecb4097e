"""Starting servers on a deploy output: a Triton Inference Server here or the command one node
runs (server.py), the Slurm and Kubernetes launchers across nodes (cluster.py: the job in
cluster_job.py, rendered by slurm.py and kubernetes.py), a copy of the repository with other
runners (overlay.py), TensorRT-LLM's LLM-API model files copied into a pytorch deployment before
tritonserver starts (llmapi_model.py), and whether this machine can serve a deployment at all
(doctor.py)."""

"""Starting servers on a deploy output: a Triton Inference Server here (server.py; its Python
stub's interpreter under numpy 2: stub_python.py) or the command one GPU node runs
(node_command.py), the Slurm and Kubernetes launchers across nodes (cluster.py: the job in
cluster_job.py, rendered by slurm.py and kubernetes.py), the pytorch backend behind NVIDIA Dynamo
(dynamo.py: one node; dynamo_slurm.py; dynamo_k8s.py: a DynamoGraphDeployment), a copy of the repository with other
runners (overlay.py), TensorRT-LLM's LLM-API model files copied into a pytorch deployment before
tritonserver starts (llmapi_model.py), and whether this machine can serve a deployment at all
(doctor.py)."""

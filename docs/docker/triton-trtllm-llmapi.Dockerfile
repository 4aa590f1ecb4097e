# Triton Inference Server with TensorRT-LLM >= 1.3, for the pytorch backend behind Triton
# (`serve --api triton`: TensorRT-LLM's LLM-API Python model). NVIDIA publishes no such image: the
# last Triton `trtllm-python-py3` images, 26.04-26.07, carry TensorRT-LLM 1.2.1, and none was built
# after them (triton-inference-server/server#8805 asks for one). This one starts from NVIDIA's TensorRT-LLM
# release image, whose torch and TensorRT-LLM stay as they are, adds tritonserver with its Python
# backend from the Triton image of the same Ubuntu and Python, and the LLM-API model repository
# of the same TensorRT-LLM release. Not built by this project's CI (linted with hadolint); build
# it on a machine with network access, then run `trtllm-dflash doctor` inside it on the GPU box.
#
#   docker build -f docs/docker/triton-trtllm-llmapi.Dockerfile \
#       --build-arg TRTLLM_VERSION=1.3.0rc29 --build-arg TRITON_VERSION=26.07 -t triton-trtllm:1.3.0rc29 .

ARG TRTLLM_VERSION=1.3.0rc29
ARG TRITON_VERSION=26.07

FROM nvcr.io/nvidia/tritonserver:${TRITON_VERSION}-py3 AS triton

FROM nvcr.io/nvidia/tensorrt-llm/release:${TRTLLM_VERSION}
ARG TRTLLM_VERSION

# The libraries tritonserver's core and the Python backend stub load at run time (what Triton's
# own build installs in its runtime images); the release image has CUDA, NCCL and Python 3.12.
# Unpinned: the release image's Ubuntu decides the versions.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends libb64-0d libre2-10 libarchive13 libnuma1 libssl3 libcurl4 \
    && rm -rf /var/lib/apt/lists/*

COPY --from=triton /opt/tritonserver /opt/tritonserver
ENV PATH=/opt/tritonserver/bin:${PATH} \
    LD_LIBRARY_PATH=/opt/tritonserver/lib:${LD_LIBRARY_PATH}

# The LLM-API model (model.py, helpers.py, config.pbtxt) of the same release: its model.py must
# match the installed tensorrt_llm. `trtllm-dflash serve --api triton` launch lines copy its
# 1/model.py and 1/helpers.py into the deployed repository before tritonserver starts.
SHELL ["/bin/bash", "-o", "pipefail", "-c"]
RUN git clone --depth 1 --filter=blob:none --sparse --branch "v${TRTLLM_VERSION}" \
        https://github.com/NVIDIA/TensorRT-LLM.git /opt/tensorrt_llm_src \
    && git -C /opt/tensorrt_llm_src sparse-checkout set triton_backend/all_models/llmapi \
    && test -f /opt/tensorrt_llm_src/triton_backend/all_models/llmapi/tensorrt_llm/1/model.py
ENV TRTLLM_LLMAPI_MODEL_DIR=/opt/tensorrt_llm_src/triton_backend/all_models/llmapi/tensorrt_llm

# Triton's Python backend runs model.py with the image's Python; model.py imports these.
RUN python3 -c "import tensorrt_llm, yaml, pandas, numpy, mpi4py; print('tensorrt_llm', tensorrt_llm.__version__)"

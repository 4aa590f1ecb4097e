"""Record the CPU calibration and a sweep right after it, for tests/project/test_cpu_projection.py
and the cpu entry of recipe/catalog/hardware.yaml:

    python tests/project/record_cpu_sweep.py [WORKDIR]

Runs the embedded recipe as the test does (test_cpu_projection.OVERRIDES): convert and deploy,
serve it, calibrate (pass rates in process, serving costs probed at concurrency 3 and 6), stop,
then `pipeline.run` sweeps it. Writes tests/project/data/cpu-tiny-pystd-sweep.json and prints the
`measured:` block to paste into the cpu entry of the hardware catalog. Run it on an otherwise idle
machine: every number is a wall-clock measurement.
"""

import datetime
import json
import os
import sys
import tempfile
from dataclasses import asdict
from pathlib import Path

import yaml
from test_cpu_projection import DATA, OVERRIDES, served_rows

from trtllm_dflash import pipeline
from trtllm_dflash.deploy.settings import REPOSITORY
from trtllm_dflash.launch.server import Endpoints, TritonServer
from trtllm_dflash.project.calibrate import PROBE_LEVELS, calibrate
from trtllm_dflash.project.report import read_measured
from trtllm_dflash.recipe import load_recipe
from trtllm_dflash.recipe.hardware import cpu_torch_threads


def main(work: Path) -> None:
    r = load_recipe(None, OVERRIDES)
    pipeline.run(r, work, until="deploy", progress=False)
    endpoints = Endpoints.free()
    with TritonServer(work / "deploy" / REPOSITORY, endpoints):
        cal = calibrate(r, endpoints.grpc_url)
    pipeline.run(r, work, progress=False)
    day = datetime.date.today().isoformat()
    measured = cal.measured.model_copy(update={"source": (
        f"tests/project/record_cpu_sweep.py on the {os.cpu_count()}-core development machine, {day}: reference "
        f"backend, fp32, {cpu_torch_threads(1)} torch thread(s) as the server; pass rates fitted to AR / verify / "
        "drafter passes at batch 1 and 4; serving costs probed on the tritonserver deployment at concurrency "
        f"{' and '.join(map(str, PROBE_LEVELS))}")})
    block = {k: (round(v, 4) if isinstance(v, float) else v) for k, v in measured.model_dump().items() if v is not None}
    data = {"recorded": day, "overrides": OVERRIDES, "calibration": {**cal.to_json(), "measured": block},
            "sweep": [asdict(s) for s in served_rows(read_measured(work / "sweep"))]}
    DATA.parent.mkdir(exist_ok=True)
    DATA.write_text(json.dumps(data, indent=1) + "\n")
    print(yaml.safe_dump({"measured": block}, sort_keys=False, width=100))


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else Path(tempfile.mkdtemp(prefix="cpu-sweep-")))

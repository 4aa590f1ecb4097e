"""Package layout: plugins/, perf/ and recipes/ live at the top of the repository (the product
layout) but ship inside the package as trtllm_dflash.plugins, trtllm_dflash.perf and trtllm_dflash.recipes."""
from setuptools import find_packages, setup

packages = find_packages(include=["trtllm_dflash", "trtllm_dflash.*"])
packages += ["trtllm_dflash.plugins"]
packages += [f"trtllm_dflash.plugins.{p}" for p in find_packages("plugins")]
packages += ["trtllm_dflash.recipes", "trtllm_dflash.perf"]

setup(
    packages=packages,
    package_dir={"trtllm_dflash.plugins": "plugins", "trtllm_dflash.recipes": "recipes", "trtllm_dflash.perf": "perf"},
    package_data={
        "trtllm_dflash.recipes": ["*/*.yaml"],
        "trtllm_dflash": ["recipe/catalog/*.yaml", "recipe/catalog/*.json", "assets/**/*", "prompts/data/*.jsonl",
                          "project/loop_cost.json"],
    },
)

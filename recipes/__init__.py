"""Recipe YAMLs shipped with the package (trtllm_dflash.recipes); see README."""

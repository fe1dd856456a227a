"""The quantize flow: recipe, plan, config groups, the pipeline that writes, the manifest, GPTQ and the command."""

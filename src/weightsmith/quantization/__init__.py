"""The quantize flow: the request, the recipe, the plan, config groups, the pipeline that writes, the manifest,
GPTQ's run and the command. `weightsmith.quantize(request)` (`library.quantize`) is its library call."""

"""Mixed precision to a bit budget: each module's sensitivity to each candidate scheme measured on a CPU,
then the mix that minimises the summed sensitivity within an average number of bits per weight.

`candidates` says what a module may become and what it costs in bits (as `inspect` counts them, scales
and zero points included); `sensitivity` measures what each candidate costs the model; `choose` spends
the budget; `report` writes the table, the heat map and the chosen plan.
"""

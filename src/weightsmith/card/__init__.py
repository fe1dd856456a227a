"""`weightsmith card`: a model card written only from what was measured, and a check that it still is.

Every number in the card is written next to an HTML comment naming the file and field it came from,
so `card --check` can find each one again, re-derive it from that source and name any that drifted.
"""

"""The checkpoint doctor: inspect, verify, transplant and diff, working from shard headers.

Every command reads headers first and tensor bytes only where the question needs them (values,
hashes, copies), so a 200 GB checkpoint can be examined in about a second. Results are dataclasses
that serialise to JSON; `render` turns them into tables for people.
"""

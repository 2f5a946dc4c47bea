#!/usr/bin/env python3
"""Writes N short JSONL records {"id", "text"} (10-40 words each) for job-runner benchmarks.

    python3 scripts/make-records.py 100000 > /tmp/100k.jsonl
    dustoff run summarize --input /tmp/100k.jsonl --output /tmp/o.jsonl --dry-run --device cpu
"""
import json
import random
import sys

WORDS = ("the city council approved plan bike lanes mayor said project paid parking levy shares fell "
         "percent company forecast demand europe shipping costs plant").split()

n = int(sys.argv[1]) if len(sys.argv) > 1 else 100000
random.seed(1)
out = sys.stdout
for i in range(n):
    text = " ".join(random.choice(WORDS) for _ in range(random.randint(10, 40)))
    out.write(json.dumps({"id": f"r{i}", "text": text}) + "\n")

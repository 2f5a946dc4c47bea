#!/usr/bin/env python3
"""Writes N JSONL documents {"id", "text"} of realistic length for the nightly job benchmark
(scripts/job-bench.sh): report-like prose, each document's length drawn uniformly from
MEAN +/- SPREAD words, seeded. The benchmark's files carry the tiny Qwen3-MoE reference
tokenizer (2,048 ids: ~2.35 tokens a word on this text), so the defaults give ~1,500 +/- 500 tokens.

    python3 scripts/make-docs.py 1000 680 226 > docs.jsonl
"""
import json
import random
import sys

SUBJECTS = ("the council", "the committee", "the laboratory", "the company", "the hospital", "the agency",
            "the regional office", "the board", "the research group", "the city", "the school district",
            "the supplier", "the museum", "the port authority", "the union", "the ministry")
VERBS = ("approved", "reviewed", "postponed", "announced", "rejected", "measured", "reported", "questioned",
         "published", "extended", "reduced", "increased", "delayed", "examined", "confirmed", "discussed")
OBJECTS = ("the budget for the coming year", "a plan to replace the old pumps", "the results of the survey",
           "new rules for parking near the station", "the contract with the cleaning firm",
           "a proposal to open the library on Sundays", "the cost of heating the main building",
           "the schedule of the night shifts", "an agreement on shared equipment", "the safety inspection",
           "the repair of the north bridge", "the hiring of two technicians", "the archive of old reports",
           "a request for more storage", "the price of electricity", "the renovation of the laboratory")
TAILS = ("after a long debate", "without a vote", "despite objections from several members",
         "as expected", "for the third time this year", "following complaints from residents",
         "in a short statement", "at the request of the auditors", "before the end of the quarter",
         "with a small majority", "after new figures arrived", "to the surprise of many")
NUMBERS = ("two", "three", "four", "seven", "twelve", "fifteen", "forty", "a hundred", "several")
UNITS = ("percent", "thousand euros", "weeks", "employees", "households", "machines", "kilometres")


def sentence(r):
    s = f"{r.choice(SUBJECTS)} {r.choice(VERBS)} {r.choice(OBJECTS)} {r.choice(TAILS)}"
    if r.random() < 0.4:
        s += f", and the change affects {r.choice(NUMBERS)} {r.choice(UNITS)}"
    return s[0].upper() + s[1:] + "."


def document(r, words):
    out, n = [], 0
    while n < words:
        para = " ".join(sentence(r) for _ in range(r.randint(3, 7)))
        out.append(para)
        n += len(para.split())
    return "\n\n".join(out)


def main():
    n = int(sys.argv[1]) if len(sys.argv) > 1 else 1000
    mean = int(sys.argv[2]) if len(sys.argv) > 2 else 680
    spread = int(sys.argv[3]) if len(sys.argv) > 3 else 226
    r = random.Random(7)
    for i in range(n):
        words = r.randint(mean - spread, mean + spread)
        sys.stdout.write(json.dumps({"id": f"doc{i:05d}", "text": document(r, words)}) + "\n")


main()

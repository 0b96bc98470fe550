"""One JSON line of how dark a set of samples came out, from tone_score.py's JSON on stdin (its captions the
dark-tone ones, so its tone_accuracy is the share measured dark): the fields given as KEY=VALUE arguments, then
images, dark_share and mean_tone (0 light ... 4 dark). Used by lora_subset.sh and concept_demo.sh.

  tone_score.py ... | dark_share.py model=p2 group=a
"""
import json
import sys

TONES = ["light", "medium-light", "medium", "medium-dark", "dark"]


def main():
    fields = dict(arg.split("=", 1) for arg in sys.argv[1:])
    scores = json.load(sys.stdin)
    measured = [TONES.index(row["measured"]) for row in scores["rows"]]
    fields.update(images=scores["images"], dark_share=round(scores["tone_accuracy"], 4), mean_tone=round(sum(measured) / len(measured), 3))
    print(json.dumps(fields))


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# Makes golden/alphafold_tiny/kuafu_export: kuafu-fold trains a model of the golden tiny sizes from its own
# initial values (40 steps of configs/tiny.toml's data, so no weight keeps an initial value), exports it, and
# DeepMind's AlphaFold runs the export on the golden batch (alphafold_export_reference.py). The test
# AlphaFoldModelTest.AlphaFoldRunsKuafusExportAsKuafuDoes holds Kuafu to those outputs.
# Usage: tests/apps/fastfold/kuafu_export_reference.sh BUILD_DIR AFVENV   (from the checkout's root; after
#        alphafold_reference.py has made golden/alphafold_tiny)
set -euo pipefail
build=$1 afvenv=$2
fold="$build/apps/fastfold/kuafu-fold"
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
sizes=(--set model.msa_channels=16 --set model.pair_channels=8 --set model.single_channels=16 --set model.extra_msa_channels=8
       --set model.evoformer_blocks=2 --set model.extra_msa_blocks=1 --set model.msa_heads=2 --set model.pair_heads=2
       --set model.outer_channels=4 --set model.triangle_channels=8 --set model.structure_channels=16
       --set model.structure_layers=2 --set model.ipa_heads=2 --set model.ipa_scalar_channels=4 --set model.ipa_query_points=2
       --set model.ipa_value_points=3 --set model.angle_channels=8 --set model.plddt_channels=8
       --set train.out_dir="$work/run" --set data.crop_size=32)
"$fold" train --config apps/fastfold/configs/tiny.toml "${sizes[@]}" --set train.steps=40 --set train.eval_interval=40 \
  --set train.checkpoint_interval=40 --set data.max_recycles=2 --set optim.warmup_steps=5
"$fold" export --config apps/fastfold/configs/tiny.toml "${sizes[@]}" --out "$work/export"
"$afvenv/bin/python" tests/apps/fastfold/alphafold_export_reference.py tests/apps/fastfold/golden/alphafold_tiny "$work/export"

#!/usr/bin/env bash
# full_disk_test.sh with train.async_save = true: the step-40 checkpoint is written by a background
# thread while training goes on, and the full disk is found when that checkpoint is sealed. The same
# must hold: the error names the file and the cause, every rank exits non-zero, step 20 stays the
# latest complete checkpoint, and a rerun with room resumes from it exactly.
# usage: full_disk_async_test.sh SOURCE_DIR BUILD_DIR WORK_DIR
set -euo pipefail
ASYNC_SAVE=true exec bash "$1/tests/dist/full_disk_test.sh" "$@"

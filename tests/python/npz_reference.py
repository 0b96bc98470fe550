"""NumPy's side of the .npz tests (core/io/npz): `write DIR` saves the arrays below with np.savez and
np.savez_compressed; `check FILE` loads what Kuafu wrote with np.load and compares it with them."""
import sys

import numpy as np


def arrays():
    rng = np.random.default_rng(0)
    return {
        "alphafold/alphafold_iteration/evoformer/evoformer_iteration/msa_row_attention_with_pair_bias/attention//query_w":
            rng.standard_normal((2, 8, 4, 3)).astype(np.float32),
        "f64": rng.standard_normal((5,)),
        "f16": rng.standard_normal((3, 2)).astype(np.float16),
        "i32": np.arange(-6, 6, dtype=np.int32).reshape(3, 4),
        "i64": np.array([2**40, -3], dtype=np.int64),
        "i16": np.array([[-300, 7]], dtype=np.int16),
        "i8": np.array([-5, 5], dtype=np.int8),
        "u8": np.array([0, 255, 17], dtype=np.uint8),
        "bool": np.array([[True, False, True]]),
        "scalar": np.float32(3.5) * np.ones((), dtype=np.float32),
        "empty": np.zeros((0, 4), dtype=np.float32),
        "fortran": np.asfortranarray(rng.standard_normal((3, 4, 2)).astype(np.float32)),
    }


def main():
    command, path = sys.argv[1], sys.argv[2]
    if command == "write":
        np.savez(f"{path}/stored.npz", **arrays())
        np.savez_compressed(f"{path}/deflated.npz", **arrays())
        print("ok")
    elif command == "check":
        expected = arrays()
        with np.load(path) as written:
            assert sorted(written.files) == sorted(expected), (written.files, list(expected))
            for name, value in expected.items():
                got = written[name]
                assert got.dtype == value.dtype and got.shape == value.shape, (name, got.dtype, got.shape)
                assert np.array_equal(got, value), name
        print("ok")


if __name__ == "__main__":
    main()

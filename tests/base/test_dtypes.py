"""The one element-type table (:mod:`jzero.dtypes`) against numpy's, XLA's and safetensors' own
names: each row's size is numpy's itemsize, its HLO name is what XLA prints for an array of it, and
its safetensors code is the one the ``safetensors`` package writes."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import safetensors.numpy

from jzero.dtypes import TABLE, array_bytes, by_hlo, by_name, hlo_bytes


@pytest.mark.parametrize("row", TABLE, ids=lambda row: row.name)
def test_each_row_is_what_numpy_and_xla_call_it(row):
    dtype = np.dtype(row.name)  # ml_dtypes (with JAX) gives numpy the narrow floats and 4-bit ints
    assert row.nbytes == (0.5 if row.name.endswith("int4") else dtype.itemsize)
    assert row.floating == jnp.issubdtype(dtype, jnp.floating)
    with jax.enable_x64(True):  # JAX keeps the 64-bit types only with x64 on
        text = jax.jit(lambda: jnp.zeros((3,), dtype)).lower().compile().as_text()
    assert f"{row.hlo}[3]" in text, text
    assert by_name(row.name) is row and by_hlo(row.hlo) is row and hlo_bytes(row.hlo) == row.nbytes


@pytest.mark.parametrize("row", [row for row in TABLE if row.safetensors], ids=lambda row: row.name)
def test_safetensors_codes_are_the_packages_own(row):
    header = safetensors.numpy.save({"x": np.zeros((2,), np.dtype(row.name))})
    size = int.from_bytes(header[:8], "little")
    assert f'"dtype":"{row.safetensors}"' in header[8 : 8 + size].decode()


def test_what_the_table_lacks_holds_no_bytes_and_arrays_are_shape_times_size():
    assert by_hlo("token") is None and hlo_bytes("token") == 0
    assert array_bytes((3, 5), "bfloat16") == 30 and array_bytes((), np.float32) == 4

"""The examples in the front ends' docstrings run and print what they say (doctest), and every
public function documents its arguments, return value, errors and an example."""

import doctest
import importlib

import pytest

pytest.importorskip("evoattn", reason="evoattn is not installed (pip install .)")


# Each front-end module and the framework it needs.
MODULES = {"evoattn.torch": "torch", "evoattn.jax": "jax", "evoattn.distributed": "torch",
           "evoattn.jax_distributed": "jax"}


@pytest.mark.parametrize("name", sorted(MODULES))
def test_docstring_examples_run(name):
    pytest.importorskip(MODULES[name])
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.NORMALIZE_WHITESPACE)
    assert result.attempted > 0 and result.failed == 0


@pytest.mark.parametrize("name", sorted(MODULES))
def test_public_functions_are_documented_and_annotated(name):
    pytest.importorskip(MODULES[name])
    module = importlib.import_module(name)
    for fn_name in module.__all__:
        fn = getattr(module, fn_name)
        doc = fn.__doc__ or ""
        for section in ("Args:", "Returns:", "Raises:", "Example:"):
            assert section in doc, f"{name}.{fn_name}: no '{section}' section"
        assert "return" in fn.__annotations__, f"{name}.{fn_name}: no return annotation"

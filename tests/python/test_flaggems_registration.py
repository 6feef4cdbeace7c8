"""Which FlagGems functions flagos registers, checked on any machine: a
function that cannot take its operator's arguments as the invoker passes them
(every schema argument, keyword-only ones by name) is not registered, so the
operator runs natively instead of raising TypeError in the middle of a model."""

from torch_fl import flaggems


def test_a_function_narrower_than_its_operator_is_refused():
    def group_mm(A, B, offs):  # FlagGems 5.0.2's _grouped_mm: no bias, no out_dtype
        return A

    why = flaggems._signature_mismatch("_grouped_mm", group_mm)
    assert "group_mm" in why and "out_dtype" in why, why


def test_a_missing_keyword_only_argument_is_refused():
    def add(self, other):  # add.Tensor has the keyword-only alpha
        return self

    def multinomial(prob, n_samples, with_replacement=False, *, gen=None):  # FlagGems 5.0.2's
        return prob

    assert "alpha" in flaggems._signature_mismatch("add.Tensor", add)
    assert "generator" in flaggems._signature_mismatch("multinomial", multinomial)


def test_matching_and_variadic_functions_are_accepted():
    def add(self, other, *, alpha=1):
        return self

    def anything(*args, **kwargs):
        return None

    def layer_norm_backward(grad_out, input, normalized_shape, mean, rstd, weight=None,
                            bias=None, output_mask=None):
        return None

    assert flaggems._signature_mismatch("add.Tensor", add) == ""
    assert flaggems._signature_mismatch("_grouped_mm", anything) == ""
    assert flaggems._signature_mismatch("native_layer_norm_backward", layer_norm_backward) == ""
    # An operator this torch does not have is left to registration to report.
    assert flaggems._signature_mismatch("no_such_operator", add) == ""

"""The planner's link priors: one for every chip type the datasheets accept, aliases included,
and the CPU host's assumed figure."""

import pytest

from gdn_core.datasheets import ACCELERATOR_TYPES, canonical_accelerator_type
from service.planner.link_priors import LINK_PRIORS, link_prior


@pytest.mark.parametrize("accelerator_type", ACCELERATOR_TYPES)
def test_every_accepted_chip_type_has_a_prior(accelerator_type):
    # the roofline asks for the prior of any chip a request may name
    prior = link_prior(accelerator_type)
    assert prior is LINK_PRIORS[canonical_accelerator_type(accelerator_type)]
    assert prior.bytes_per_s > 0 and prior.latency_s > 0 and prior.source


def test_aliases_and_spellings_mean_the_sxm_part_and_cpu_is_its_own():
    assert link_prior("H100") is link_prior("h100-sxm") is not link_prior("h100-pcie")
    assert link_prior("h100-pcie").bytes_per_s < link_prior("h100-sxm").bytes_per_s  # no NVLink
    assert link_prior("cpu") is LINK_PRIORS["cpu"]
    assert set(LINK_PRIORS) == {canonical_accelerator_type(t) for t in ACCELERATOR_TYPES} | {
        "cpu"}


def test_an_unknown_chip_names_the_accepted_types():
    with pytest.raises(ValueError, match="accelerator_type='mi300x' is not one of: v4"):
        link_prior("mi300x")

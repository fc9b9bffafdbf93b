"""Property-based: the readers of operator files and of the settings inside them (the inventory loader,
GPU sharing profiles, tenants, MIG layouts) either return a valid configuration or raise the product's
input error (InputError, exit 2), whatever they are given: values of any type where another is expected,
numbers of any size, other scripts' digits, aliases, repeated keys, broken YAML and INI. Bounded: a few
hundred examples, well under half a minute."""

from __future__ import annotations

import contextlib
import tempfile
from pathlib import Path
from typing import Any

import yaml
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from provisioner import mig, sharing, tenants
from provisioner.config import _gpu_setting_problems, load_role_specs, validate_inventory_settings
from provisioner.errors import InputError
from provisioner.inventory import load_inventory

# Words the readers look for, so that generated documents reach their deeper rules, next to any text.
WORDS = st.sampled_from(
    [
        "version", "v1", "sharing", "timeSlicing", "mps", "resources", "name", "rename", "devices",
        "replicas", "renameByDefault", "failRequestsGreaterThanOne", "all", "gpu", "nvidia.com/gpu",
        "namespace", "gpus", "mig", "max_gpus_per_pod", "node_pool", "kube-system", "gpu-operator",
        "mig-configs", "mig-enabled", "mig-devices", "device-filter", "0x233510DE", "1g.18gb", "3g.71gb",
        "9g.99gb", "0", "3:1", "٣", "²", "1g.18gb+me", "hosts", "vars", "children", "gpu1", "gpu_nodes",
        "ansible_host", "ansible_port", "gpuprov_gpu_sharing", "gpuprov_tenants", "gpuprov_mig_config",
    ]
)  # fmt: skip
SCALARS = st.one_of(
    st.none(),
    st.booleans(),
    st.integers(min_value=-(10**30), max_value=10**30),
    st.sampled_from([0, 1, 2, 7, 8, 1024, 1025, 4095, 4096, -1]),
    st.floats(allow_nan=True, allow_infinity=True),
    WORDS,
    st.text(max_size=20),
)
VALUES = st.recursive(
    SCALARS,
    lambda inner: st.one_of(
        st.lists(inner, max_size=4),
        st.dictionaries(st.one_of(WORDS, st.text(max_size=8), st.integers(0, 9)), inner, max_size=5),
    ),
    max_leaves=12,
)


def shaped(keys: list[str], leaf: st.SearchStrategy[Any] = VALUES) -> st.SearchStrategy[dict[str, Any]]:
    """Mappings with some of `keys` (and now and then a stranger), values of any shape."""
    return st.dictionaries(st.one_of(st.sampled_from(keys), WORDS), leaf, max_size=len(keys) + 1)


RESOURCE = shaped(["name", "rename", "devices", "replicas"])
REPLICATED = shaped(
    ["renameByDefault", "failRequestsGreaterThanOne", "resources"],
    st.one_of(VALUES, st.lists(RESOURCE, max_size=3)),
)
SHARING_DOC = shaped(
    ["version", "flags", "sharing"], st.one_of(VALUES, shaped(["timeSlicing", "mps"], REPLICATED))
)
TENANT = shaped(list(tenants.KEYS))
MIG_ENTRY = shaped(
    ["devices", "mig-enabled", "mig-devices", "device-filter"],
    st.one_of(
        VALUES, st.dictionaries(st.one_of(WORDS, st.text(max_size=8)), st.integers(-2, 10**9), max_size=4)
    ),
)
MIG_DOC = shaped(
    ["version", "mig-configs"],
    st.one_of(VALUES, st.dictionaries(WORDS, st.lists(MIG_ENTRY, max_size=3), max_size=3)),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(SHARING_DOC)
def test_a_sharing_profile_is_a_config_or_an_input_error(doc: dict[str, Any]) -> None:
    with contextlib.suppress(InputError):
        config = sharing.parse_document(doc, "p")
        assert all(sharing.MIN_REPLICAS <= r.replicas <= sharing.MAX_REPLICAS for r in config.resources)
        assert all(v >= 0 for v in config.allocatable(8).values())


@settings(max_examples=200, deadline=None)
@given(st.one_of(VALUES, st.lists(st.one_of(TENANT, VALUES), max_size=4)))
def test_tenants_are_tenants_or_an_input_error(value: Any) -> None:
    with contextlib.suppress(InputError):
        for tenant in tenants.parse_tenants(value, "gpuprov_tenants"):
            assert tenant.namespace not in (*tenants.SYSTEM_NAMESPACES, tenants.DEFAULT_OPERATOR_NAMESPACE)
            assert all(isinstance(n, int) and 0 <= n <= tenants.MAX_GPUS for n in tenant.quota().values())


@settings(max_examples=200, deadline=None)
@given(st.one_of(MIG_DOC, VALUES))
def test_a_mig_layout_file_is_layouts_or_an_input_error(doc: Any) -> None:
    text = yaml.safe_dump(doc)
    with contextlib.suppress(InputError):
        configs = mig.parse_config(text, "layouts.yaml")
        assert isinstance(mig.offline_problems(configs), list)
        for name in configs:
            for device_id in (0x2335, 0x20B0, 0x1234):
                mig.check_layout(configs, name, device_id=device_id, gpu_count=8, driver_branch=580)


KNOBS = st.fixed_dictionaries(
    {},
    optional={
        "gpuprov_gpu_sharing": st.one_of(VALUES, WORDS),
        "gpuprov_gpu_sharing_profiles": st.one_of(
            VALUES, st.dictionaries(WORDS, st.one_of(SHARING_DOC, VALUES), max_size=3)
        ),
        "gpuprov_tenants": st.one_of(VALUES, st.lists(TENANT, max_size=3)),
        "gpu_tenants_list": st.lists(TENANT, max_size=2),
        "gpu_operator_namespace": st.one_of(WORDS, VALUES),
        "gpuprov_mig_config": st.one_of(WORDS, VALUES),
        "gpuprov_mig_strategy": st.one_of(st.sampled_from(["single", "mixed"]), VALUES),
        "gpuprov_mig_custom_configs": st.one_of(MIG_DOC, VALUES),
        "gpuprov_node_pool": st.one_of(WORDS, VALUES),
    },
)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(KNOBS)
def test_gpu_settings_of_any_shape_are_problems_never_a_crash(hostvars: dict[str, Any]) -> None:
    problems = _gpu_setting_problems(hostvars)
    assert all(isinstance(key, str) and isinstance(why, str) for key, why in problems)


# Inventory files: documents of any shape with the inventory's own words, as YAML, then mangled as an
# operator's editor (or a hostile file) might: aliases, a repeated line, a cut, stray text.
GROUP = st.deferred(
    lambda: shaped(
        ["hosts", "vars", "children"],
        st.one_of(VALUES, st.dictionaries(WORDS, st.one_of(st.none(), VALUES, GROUP), max_size=3)),
    )
)
MANGLE = st.sampled_from(["none", "alias", "repeat-line", "cut", "noise", "ini"])


@st.composite
def inventory_text(draw: st.DrawFn) -> str:
    text = yaml.safe_dump(draw(st.one_of(st.dictionaries(WORDS, GROUP, max_size=3), VALUES)), width=1000)
    how = draw(MANGLE)
    lines = text.splitlines(keepends=True)
    if how == "alias":
        text = "x: &x [1, 2]\ny: [*x, *x]\n" + text
    elif how == "repeat-line" and lines:
        i = draw(st.integers(0, len(lines) - 1))
        text = "".join([*lines[: i + 1], lines[i], *lines[i + 1 :]])
    elif how == "cut":
        text = text[: draw(st.integers(0, len(text)))]
    elif how == "noise":
        at = draw(st.integers(0, len(text)))
        text = text[:at] + draw(st.text(max_size=30)) + text[at:]
    elif how == "ini":
        text = draw(st.sampled_from(["[gpu_nodes]\n", "[all:vars]\n", ""])) + "\n".join(
            draw(st.lists(st.text(alphabet="gpu1 =ab[]:#;'\"\t", max_size=30), max_size=5))
        )
    return text


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(inventory_text(), st.one_of(st.none(), inventory_text()), st.sampled_from(["hosts.yml", "hosts"]))
def test_an_inventory_is_hosts_or_an_input_error(hosts: str, group_vars: str | None, name: str) -> None:
    with tempfile.TemporaryDirectory(prefix="gpuprov-fuzz-") as tmp:
        root = Path(tmp)
        (root / name).write_text(hosts)
        if group_vars is not None:
            (root / "group_vars").mkdir()
            (root / "group_vars" / "all.yml").write_text(group_vars)
        with contextlib.suppress(InputError):
            inventory = load_inventory(root / name)
            selected = inventory.select(None)
            validate_inventory_settings(inventory, selected, load_role_specs())

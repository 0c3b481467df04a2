"""What importing the package costs and does: the losses need only torch, the public names stay where
they were, and importing changes no global state."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def run_python(code: str) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter (``sys.modules`` as a user's first import finds it)."""
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1"}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], cwd=REPO, env=env, capture_output=True,
                          text=True, timeout=300)


def test_importing_the_losses_needs_only_torch():
    result = run_python("""
        import sys
        import mgsr_lightning.losses

        assert "lightning" not in sys.modules
        assert "transformers" not in sys.modules
        ours = sorted(name for name in sys.modules if name.startswith("mgsr_lightning"))
        allowed = ("mgsr_lightning", "mgsr_lightning.lazy", "mgsr_lightning.batch", "mgsr_lightning.losses")
        assert all(name in allowed or name.startswith("mgsr_lightning.losses.") for name in ours), ours
    """)
    assert result.returncode == 0, result.stderr


def test_public_names_import_as_before():
    result = run_python("""
        import sys
        import mgsr_lightning
        import mgsr_lightning.evaluation

        assert "lightning" not in sys.modules  # the package's own names are imported on first use
        from mgsr_lightning import DistillLightningModule, InstructionDataModule
        from mgsr_lightning.losses import DIVERGENCES, DistillLoss, dac_kl, forward_kl

        assert DistillLightningModule.__module__ == "mgsr_lightning.module"
        assert InstructionDataModule.__module__ == "mgsr_lightning.data.datamodule"
        assert {"DistillLightningModule", "InstructionDataModule"} <= set(dir(mgsr_lightning))
        for name in mgsr_lightning.__all__:
            getattr(mgsr_lightning, name)
        try:
            from mgsr_lightning import no_such_name  # noqa: F401
        except ImportError:
            pass
        else:
            raise AssertionError("an unknown name imported")
    """)
    assert result.returncode == 0, result.stderr


def test_importing_the_cli_changes_no_global_state_and_run_cli_sets_it_up():
    result = run_python("""
        import logging
        import warnings

        from jsonargparse._loaders_dumpers import loaders

        from mgsr_lightning import lightning_workarounds
        from mgsr_lightning.cli import lightning_cli as cli

        def leafspec_filtered():
            return any("LeafSpec" in str(getattr(f[1], "pattern", "")) for f in warnings.filters)

        tips = logging.getLogger("lightning.pytorch.utilities.rank_zero")
        assert not leafspec_filtered(), "importing the CLI changed the warning filters"
        assert cli.PARSER_MODE not in loaders, "importing the CLI registered its config loader"
        assert not [f for f in tips.filters if isinstance(f, lightning_workarounds._NoAdvertisements)]

        try:  # a config composed from _base_ files needs the loader
            cli.run_cli(["fit", "--config", "configs/tiny/kd.yaml", "--print_config"])
        except SystemExit as exit:
            assert exit.code in (0, None), exit.code
        assert loaders[cli.PARSER_MODE] is cli.load_config_text
        assert [f for f in tips.filters if isinstance(f, lightning_workarounds._NoAdvertisements)]
        assert leafspec_filtered()
    """)
    assert result.returncode == 0, result.stderr[-3000:]


def test_importing_the_module_loads_nothing_of_the_data_side_and_changes_no_global_state():
    result = run_python("""
        import sys
        import warnings

        import lightning.pytorch  # noqa: F401  (Lightning's warning formatter and filters first)
        import torchmetrics  # noqa: F401
        import transformers  # noqa: F401

        formatter = warnings.formatwarning
        import mgsr_lightning.module  # noqa: F401

        loaded = [name for name in sys.modules if name == "pyarrow" or name.startswith(("pyarrow.",
                  "mgsr_lightning.data", "mgsr_lightning.pipeline", "mgsr_lightning.cli"))]
        assert not loaded, loaded
        assert warnings.formatwarning is formatter, "importing the module replaced the warning formatter"
        ours = [f for f in warnings.filters if "eval mode" in str(getattr(f[1], "pattern", ""))]
        assert not ours, "importing the module changed the warning filters"
    """)
    assert result.returncode == 0, result.stderr[-3000:]

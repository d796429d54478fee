"""The memory picture names what each line measures: anonymous memory is the expert cache and
everything else the process allocated, so it is not labelled as the cache."""

from __future__ import annotations

import numpy as np
import pandas as pd

from bmoe.render.plots.runs import memory_figure


def test_anonymous_memory_is_not_called_the_expert_cache() -> None:
    steps = np.arange(1, 6)
    # a 2 MiB budget beside 73 MiB of anonymous memory (KV cache, buffers, interpreter)
    memory = pd.DataFrame(
        {"step": steps, "rss_anon_mib": 73.0, "rss_file_mib": 8.0, "cache_budget_mib": 2.0}
    )
    fig = memory_figure(memory)
    labels = [t.get_text() for t in fig.axes[0].get_legend().get_texts()]
    anon = next(label for label in labels if label.startswith("RSS anon"))
    assert "expert cache" not in anon and "KV" in anon
    assert "cache budget" in labels

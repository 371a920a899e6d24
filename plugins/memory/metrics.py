"""
The memory plugin's metrics for C{/metrics}: plans and their tokens,
summaries, reflections, the store's writes and what it holds.
"""

from __future__ import annotations

from collections.abc import Iterator

from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily

from rpmiddleware.builtin.memory.parts import MemoryParts


class MemoryMetrics(MemoryParts):
    """
    L{Memory}'s C{collectMetrics}: a part of the plugin's class, in a
    module of its own.
    """

    def collectMetrics(self) -> Iterator[CounterMetricFamily | GaugeMetricFamily]:
        yield CounterMetricFamily(
            "rpmiddleware_memory_planned_tokens",
            "Tokens (RPEngine's estimate) of the requests the memory plugin planned.",
            value=self.counts["tokens"],
        )
        yield CounterMetricFamily(
            "rpmiddleware_memory_plans",
            "Requests the memory plugin gave a conversation to.",
            value=self.counts["planned"],
        )
        summaries = CounterMetricFamily(
            "rpmiddleware_memory_summaries",
            "Summaries RPEngine wrote for the memory plugin, by outcome.",
            labels=["outcome"],
        )
        summaries.add_metric(["written"], self.counts["summaries"])
        summaries.add_metric(["failed"], self.counts["summaryFailures"])
        yield summaries
        reflections = CounterMetricFamily(
            "rpmiddleware_memory_reflections",
            "Reflections RPEngine answered for the memory plugin, by outcome (dropped: the "
            "answer failed its schema, or the request failed).",
            labels=["outcome"],
        )
        reflections.add_metric(["kept"], self.counts["reflections"])
        reflections.add_metric(["dropped"], self.counts["reflectionFailures"])
        yield reflections
        yield CounterMetricFamily(
            "rpmiddleware_memory_store_writes",
            "Transactions committed to the memory database.",
            value=self.store.writes,
        )
        lost = CounterMetricFamily(
            "rpmiddleware_memory_store_lost",
            "Writes to the memory database given up (the disk locked or failing past "
            "write_timeout), by what they were; each was reported to the game.",
            labels=["what"],
        )
        for what, count in sorted(self.lostWrites.items()):
            lost.add_metric([what], count)
        yield lost
        yield GaugeMetricFamily(
            "rpmiddleware_memory_store_queued",
            "Memory database work waiting for or running on the store's own thread.",
            value=self.store.queued,
        )
        # Measured on the store's reader thread, never at the scrape.
        size = self.saves.sizeForMetrics()
        yield GaugeMetricFamily(
            "rpmiddleware_memory_store_bytes",
            "Bytes of the memory database file and its -wal log, as last measured.",
            value=size["bytes"],
        )
        yield GaugeMetricFamily(
            "rpmiddleware_memory_store_entries",
            "Entries (lines) kept in the memory database, as last measured.",
            value=size["entries"],
        )
        yield GaugeMetricFamily(
            "rpmiddleware_memory_store_saves",
            "Game saves kept in the memory database, as last measured.",
            value=size["saves"],
        )

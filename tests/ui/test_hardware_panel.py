"""The hardware panel driven through its widgets (pytest-qt, offscreen)."""
from __future__ import annotations

import pytest
from PySide6.QtCore import Qt

from app.runtime.hw_report import hardware_report
from app.ui.hardware_panel import HardwarePanel
from tests.engine.fake_sysfs import XEON, one_node_vm, two_socket_server


@pytest.fixture
def server_report(tmp_path):
    report = hardware_report(two_socket_server(tmp_path / "server"))
    report["bandwidth_gb_s"] = 40.0          # as if measured
    report["weight_stream_gb_s"] = 31.5
    report["weight_stream"] = {"threads": 8}
    return report


@pytest.fixture
def panel(qtbot, server_report):
    p = HardwarePanel(server_report)
    qtbot.addWidget(p)
    p.show()
    return p


def test_panel_shows_the_report(panel):
    assert panel.cpu.text() == XEON
    assert panel.cores.text() == "8 physical, 16 logical, 2 sockets (SMT)"
    assert panel.nodes.text() == "node 0: CPUs 0-3,8-11, 64.0 GiB\nnode 1: CPUs 4-7,12-15, 64.0 GiB"
    assert panel.governor.text() == "powersave"
    assert panel.bandwidth.text() == "40.0 GB/s"
    assert panel.stream.text() == "31.5 GB/s through the weight kernels (8 threads)"
    assert panel.plan.text() == "8 threads, one per physical core; NUMA distribute: node 0: CPUs 0-3; node 1: CPUs 4-7"
    assert panel.kv.text() == "no model chosen"
    assert panel.live.text() == "Live: idle"
    # the warning is visible, in the warning colour
    assert panel.warnings.isVisible()
    assert panel.warnings.text().startswith("⚠ the CPU frequency governor is powersave")
    assert "sudo cpupower frequency-set -g performance" in panel.warnings.text()
    assert "#b00020" in panel.warnings.styleSheet()
    # controls start at the report's plan
    assert (panel.threads.minimum(), panel.threads.maximum(), panel.threads.value()) == (0, 16, 0)
    assert panel.threads.text() == "auto (one per core)"
    assert panel.policy.currentText() == "distribute"


def test_changing_threads_and_policy_emits_the_signal(qtbot, panel):
    panel.threads.setValue(4)
    panel.policy.setCurrentText("isolate")
    with qtbot.waitSignal(panel.sig_threads_changed, timeout=1000) as blocker:
        qtbot.mouseClick(panel.apply_button, Qt.MouseButton.LeftButton)
    assert blocker.args == [4, "isolate"]


def test_live_line(panel):
    panel.set_live(12.5, 10.0)
    assert panel.live.text() == "Live: 12.5 tok/s, 10.00 GB/s (25% of the measured 40.0 GB/s)"
    panel.set_live(None, None)
    assert panel.live.text() == "Live: idle"


def test_set_report_replaces_everything(qtbot, panel, tmp_path):
    vm = hardware_report(one_node_vm(tmp_path / "vm"), threads=1, numa_policy="none")
    panel.set_report(vm)
    assert panel.cpu.text() == "AMD EPYC Processor"
    assert panel.plan.text() == "1 thread on 1 of 2 physical cores; CPU 0 (one NUMA node)"
    assert not panel.warnings.isVisible()
    assert (panel.threads.maximum(), panel.threads.value(), panel.policy.currentText()) == (2, 1, "none")
    panel.set_live(3.0, 1.5)
    assert panel.live.text() == "Live: 3.0 tok/s, 1.50 GB/s"     # no measured bandwidth to compare with

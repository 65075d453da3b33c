"""The HTML report in a real headless Chromium (Debian's chromium + chromedriver, driven by
Selenium): it loads with no console error and no network request, its diagram shows every
node and every hop of the walk, a dropped path is marked at the dropping hop, and a
screenshot of it is not blank.
"""

from __future__ import annotations

import json
import os
import shutil
import struct
import zlib
from pathlib import Path

import pytest
import yaml
from typer.testing import CliRunner

from traceflow.cli.app import app, example_path

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="needs Debian's chromium and chromium-driver")

runner = CliRunner()


@pytest.fixture(scope="module")
def browser(tmp_path_factory):
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service

    opts = webdriver.ChromeOptions()
    opts.binary_location = CHROMIUM
    for arg in ("--headless", "--no-sandbox", "--disable-gpu", "--no-first-run",
                "--disable-background-networking", "--disable-component-update",
                "--disable-sync", "--window-size=1400,1000",
                f"--user-data-dir={tmp_path_factory.mktemp('chromium-profile')}"):
        opts.add_argument(arg)
    opts.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    driver = webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=opts)
    driver.get("about:blank")        # away from the new-tab page before any report loads
    yield driver
    driver.quit()


def report(bundle: Path, out: Path) -> tuple[Path, dict]:
    args = ["pod-to-svc", "frontend", "backendsvc", "--bundle", str(bundle)]
    r = runner.invoke(app, [*args, "-o", "html"])
    assert r.exit_code in (0, 1), r.output
    out.write_text(r.stdout, encoding="utf-8")
    doc = json.loads(runner.invoke(app, [*args, "-o", "json"]).stdout)
    return out, doc


def load(driver, page: Path) -> None:
    driver.get_log("browser")
    driver.get_log("performance")
    driver.get(page.as_uri())
    assert driver.find_element("id", "summary")


def requests(driver) -> list[str]:
    """Requests the report made, and any request to the network: Chromium's own pages (the
    new-tab page loading in the background) are not the report's."""
    urls = []
    for entry in driver.get_log("performance"):
        msg = json.loads(entry["message"])["message"]
        if msg["method"] == "Network.requestWillBeSent":
            url = msg["params"]["request"]["url"]
            document = msg["params"].get("documentURL", "")
            if document.startswith("file:") or not url.startswith(("chrome", "about:")):
                urls.append(url)
    return urls


def png_is_not_blank(png: bytes) -> bool:
    """Decode the PNG's pixels (8-bit RGB/RGBA, no interlace) and look for real content."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    pos, idat, width, height, channels = 8, b"", 0, 0, 0
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour = struct.unpack(">IIBB", data[:10])
            assert depth == 8 and colour in (2, 6)
            channels = 3 if colour == 2 else 4
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    raw = zlib.decompress(idat)
    stride = width * channels + 1
    # filter bytes aside, count rows that differ from a plain background
    busy_rows = sum(1 for y in range(height)
                    if len(set(raw[y * stride + 1:(y + 1) * stride])) > 4)
    return width > 0 and busy_rows > height // 10


def hop_refs(doc: dict) -> list[str]:
    refs = []
    for i, path in enumerate(doc["paths"], 1):
        n = sum(len(leg["hops"]) for leg in path["legs"])
        refs.extend(f"{i}.{k}" for k in range(1, n + 1))
    return refs


def test_demo_report(browser, tmp_path):
    page, doc = report(example_path(), tmp_path / "demo.html")
    load(browser, page)
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
    assert requests(browser) in ([], [page.as_uri()])       # the page itself, nothing else
    assert browser.execute_script(
        "return performance.getEntriesByType('resource').length") == 0

    summary = browser.find_element("id", "summary").text
    assert "default/frontend -> default/backendsvc" in summary
    assert "antrea-packet-walk-example" in summary and "2020-09-21T11:30:00Z" in summary
    for path in doc["paths"]:
        assert path["endpoint"] in summary

    svgs = browser.find_elements("css selector", "svg.diagram")
    assert len(svgs) == len(doc["paths"])
    nodes = {h["node"] for p in doc["paths"] for leg in p["legs"] for h in leg["hops"]}
    lanes = {e.get_attribute("data-node")
             for e in browser.find_elements("css selector", "svg.diagram g.lane")}
    assert lanes == nodes == {"worker1", "worker2"}
    for node in nodes:
        assert browser.find_elements("xpath", f"//*[local-name()='text' and "
                                              f"normalize-space()='node {node}']")
    drawn = {e.get_attribute("data-hop"): e
             for e in browser.find_elements("css selector", "svg.diagram text.hop")}
    assert sorted(drawn) == sorted(hop_refs(doc))
    assert drawn["2.29"].text.startswith("2.29 tunnel geneve")
    assert drawn["1.12"].is_displayed()
    assert not browser.find_elements("css selector", "svg .stop")     # nothing stopped

    # a hop's detail is folded until asked for
    row = browser.find_element("id", "hop-1.12")
    rule = row.find_element("css selector", "details pre")
    assert not rule.is_displayed()
    row.find_element("css selector", "summary").click()
    assert rule.is_displayed() and "DNAT 10.104.65.133:80 -> 10.222.1.47:80" in rule.text
    assert "iptables-nat-list.txt:" in row.text
    assert "-p: protocol; the packet is TCP" in row.text              # why it matched
    assert "nw_dst 10.104.65.133 -> 10.222.1.47" in row.text

    shot = tmp_path / "demo.png"
    browser.save_screenshot(str(shot))
    assert png_is_not_blank(shot.read_bytes())
    _keep(shot)


def test_dropped_path_is_marked_at_the_dropping_hop(browser, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(example_path(), bundle)
    pols = yaml.safe_load((bundle / "k8s/networkpolicies.yaml").read_text())
    for item in pols["items"]:
        if item["metadata"]["name"] == "backendpolicy":
            item["spec"]["ingress"] = []
    (bundle / "k8s/networkpolicies.yaml").write_text(yaml.safe_dump(pols))
    flows = bundle / "nodes/worker2/ovs-flows.txt"
    flows.write_text("".join(
        line for line in flows.read_text().splitlines(keepends=True)
        if not ("table=90" in line and ("conjunction(1," in line or "conj_id=1" in line))))
    page, doc = report(bundle, tmp_path / "dropped.html")
    dropped = next(i for i, p in enumerate(doc["paths"], 1) if p["verdict"] == "dropped")
    path = doc["paths"][dropped - 1]
    last = sum(len(leg["hops"]) for leg in path["legs"])
    last_hop = path["legs"][-1]["hops"][-1]
    assert (last_hop["node"], last_hop["component"], last_hop["table"]) == (
        path["drop"]["node"], path["drop"]["component"], path["drop"]["table"])
    ref = f"{dropped}.{last}"

    load(browser, page)
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
    assert requests(browser) in ([], [page.as_uri()])
    marked = browser.find_elements("css selector", "svg.diagram text.stop")
    assert [e.get_attribute("data-hop") for e in marked] == [ref]
    assert "drop" in marked[0].get_attribute("class").split()
    assert "DROPPED" in marked[0].text and "ovs 100 IngressDefaultRule" in marked[0].text
    station = marked[0].find_element("xpath", "..")
    assert station.get_attribute("data-node") == "worker2"
    assert station.find_element("css selector", "rect").get_attribute("stroke") == "#d93025"
    assert "stop" in browser.find_element("id", f"hop-{ref}").get_attribute("class")
    summary = browser.find_element("id", "summary").text
    assert f"{ref} worker2 ovs 100 IngressDefaultRule" in summary
    assert sorted(e.get_attribute("data-hop") for e in browser.find_elements(
        "css selector", "svg.diagram text.hop")) == sorted(hop_refs(doc))

    browser.execute_script("arguments[0].scrollIntoView({block: 'center'})", marked[0])
    shot = tmp_path / "dropped.png"
    browser.save_screenshot(str(shot))
    assert png_is_not_blank(shot.read_bytes())
    _keep(shot)


def test_report_escapes_bundle_text(browser, tmp_path):
    bundle = tmp_path / "bundle"
    shutil.copytree(example_path(), bundle)
    pods = bundle / "k8s/pods.yaml"
    pods.write_text(pods.read_text().replace("antrea-packet-walk", "x"))
    manifest = bundle / "manifest.yaml"
    manifest.write_text(manifest.read_text().replace(
        "cluster: antrea-packet-walk-example",
        'cluster: "<img src=x onerror=alert(1)><script>alert(2)</script>\\e[31m"'))
    page, _ = report(bundle, tmp_path / "escaped.html")
    html = page.read_text()
    assert "<script>" not in html and "<img" not in html and "\x1b" not in html
    load(browser, page)
    assert "<img src=x onerror=alert(1)><script>alert(2)</script>\\e[31m" in \
        browser.find_element("id", "summary").text
    assert [e for e in browser.get_log("browser") if e["level"] == "SEVERE"] == []


def _keep(shot: Path) -> None:
    """Copy a screenshot where a person can look at it (TRACEFLOW_SCREENSHOTS=folder)."""
    folder = os.environ.get("TRACEFLOW_SCREENSHOTS")
    if folder:
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, Path(folder) / shot.name)


def _html(args: list[str], out: Path) -> Path:
    r = runner.invoke(app, [*args, "-o", "html"])
    assert r.exit_code in (0, 1), r.output
    out.write_text(r.stdout, encoding="utf-8")
    return out


def _size(browser, width: int) -> None:
    browser.set_window_size(width, 1000)
    assert browser.execute_script("return document.documentElement.clientWidth") <= width


def _no_sideways_scroll(browser) -> None:
    over = browser.execute_script("""
        const vw = document.documentElement.clientWidth, out = [];
        for (const el of document.querySelectorAll('body *')) {
            const r = el.getBoundingClientRect();
            if (r.width && r.right > vw + 1 && el.offsetParent !== null
                && !el.closest('.diagram-box svg.diagram'))
                out.push(el.tagName + ' ' + Math.round(r.right));
        }
        return [document.documentElement.scrollWidth, vw, out.slice(0, 5)];""")
    assert over[0] <= over[1], over


def _shot(browser, tmp_path: Path, name: str) -> None:
    shot = tmp_path / name
    browser.save_screenshot(str(shot))
    assert png_is_not_blank(shot.read_bytes())
    _keep(shot)


@pytest.mark.parametrize("width", [1280, 390])
def test_policy_drop_report_at_desktop_and_phone_widths(browser, tmp_path, width):
    bundle = Path(example_path()).parent / "cilium-vxlan-policy"
    page = _html(["pod-to-svc", "shop/batch", "shop/web", "--bundle", str(bundle)],
                 tmp_path / "policy.html")
    _size(browser, width)
    load(browser, page)
    assert [e for e in browser.get_log("browser") if e["level"] in ("SEVERE", "WARNING")] == []
    _no_sideways_scroll(browser)
    # the why column leads with the policy and what it allows
    why = browser.find_element("css selector", "table.paths").text
    assert "denied by NetworkPolicy shop/web-from-frontend: allows only role=frontend on " \
           "TCP/8080" in " ".join(why.split())
    wide = browser.find_elements("css selector", "svg.diagram")
    narrow = browser.find_elements("css selector", "svg.diagram-narrow")
    shown = narrow if width < 700 else wide
    assert len(shown) == 2 and all(s.is_displayed() for s in shown)
    assert not any(s.is_displayed() for s in (wide if width < 700 else narrow))
    kind = "svg.diagram-narrow" if width < 700 else "svg.diagram"
    # decisions on the boxes: the backend chosen at connect(), the tunnel, the policy
    said = [e.text for e in browser.find_elements("css selector", f"{kind} text.decision")]
    assert "DNAT to 10.0.1.52:8080 (1.4)" in said and "DNAT to 10.0.2.45:8080 (2.4)" in said
    assert "tunnel to 192.168.1.12 (2.7)" in said
    assert "denied by NetworkPolicy shop/web-from-frontend" in " ".join(said)   # wrapped
    stopped = browser.find_elements("css selector", f"{kind} g.station.stopped")
    assert len(stopped) == 2
    # every hop is drawn in the view shown, the pod's own ARP inside the pod's box
    refs = [e.get_attribute("data-hop") for e in
            browser.find_elements("css selector", f"{kind} text.hop")]
    assert refs[:2] == ["1.1", "1.2"]
    pod_box = browser.find_elements("css selector", f"{kind} g.place-pod")[0]
    assert [e.get_attribute("data-hop") for e in
            pod_box.find_elements("css selector", "text.hop")] == ["1.1", "1.2"]
    # the tunnel is not drawn in the error colour
    for g in browser.find_elements("css selector", f"{kind} g.place-tunnel, {kind} "
                                                   "g.place-underlay"):
        assert g.find_element("css selector", "rect").get_attribute("fill") not in (
            "#fce8e6", "#d93025")
    assert browser.find_element("id", "legend").is_displayed()
    browser.execute_script("arguments[0].scrollIntoView()", shown[1])
    _shot(browser, tmp_path, f"policy-{width}.png")
    _size(browser, 1400)


def test_single_node_diagram_uses_the_width(browser, tmp_path):
    page = _html(["pod-to-pod", "frontend", "backend1", "--bundle", str(example_path())],
                 tmp_path / "single.html")
    _size(browser, 1280)
    load(browser, page)
    _no_sideways_scroll(browser)
    box = browser.find_element("css selector", ".diagram-box")
    lane = browser.find_element("css selector", "svg.diagram g.lane rect")
    assert lane.rect["width"] >= 0.85 * box.rect["width"], (lane.rect, box.rect)
    svg = browser.find_element("css selector", "svg.diagram")
    # the leg titles and every text fit inside the drawing: nothing clipped
    clipped = browser.execute_script("""
        const svg = arguments[0], w = svg.viewBox.baseVal.width, out = [];
        for (const t of svg.querySelectorAll('text')) {
            const b = t.getBBox();
            if (b.x < 0 || b.x + b.width > w) out.push(t.textContent);
        }
        return out;""", svg)
    assert clipped == []
    titles = [e.text for e in svg.find_elements("css selector", "text.legtitle")]
    assert any("default/frontend -> default/backend1: 10.222.1.48:54321 -> 10.222.1.47:80"
               in t for t in titles), titles
    # hops say what they decided, not only where they were
    hop = svg.find_element("css selector", "text.hop[data-hop='1.12']")
    assert "output to the port in reg1 = 48" in hop.text
    _shot(browser, tmp_path, "single-1280.png")
    _size(browser, 1400)

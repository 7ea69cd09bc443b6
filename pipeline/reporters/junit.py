"""JUnit XML: one test suite per package, one test case per check."""

from __future__ import annotations

from xml.etree import ElementTree as ET

from raipack.core.textsafe import safe_results


def render(results, exit_code: int, color: bool = False) -> str:
    suites = ET.Element("testsuites", name="raipack validate")
    for r in safe_results(results):  # no control characters: XML 1.0 forbids most of them
        by_check = {}
        for f in r.findings:
            by_check.setdefault(f.check_id, []).append(f)
        failures = sum(1 for cid in r.checks_run if any(f.severity == "error" for f in by_check.get(cid, [])))
        suite = ET.SubElement(suites, "testsuite", name=r.root, tests=str(len(r.checks_run)), failures=str(failures), errors="0", time=f"{r.seconds:.3f}")
        ET.SubElement(ET.SubElement(suite, "properties"), "property", name="profile", value=r.profile)
        for cid in r.checks_run:
            case = ET.SubElement(suite, "testcase", classname=f"raipack.{r.profile}", name=cid)
            found = by_check.get(cid, [])
            errors = [f for f in found if f.severity == "error"]
            lines = "\n".join(f"{f.severity}: {f.path}{' [' + f.pointer + ']' if f.pointer else ''}: {f.message} (hint: {f.hint})" for f in found)
            if errors:
                el = ET.SubElement(case, "failure", message=f"{errors[0].path}: {errors[0].message}", type=cid)
                el.text = lines
            elif found:
                ET.SubElement(case, "system-out").text = lines
    ET.indent(suites)
    return ET.tostring(suites, encoding="unicode", xml_declaration=True) + "\n"

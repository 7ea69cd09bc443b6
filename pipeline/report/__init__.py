"""The visual build report (report.html): one self-contained page per package, no script, no network.

`collect.py` gathers the data (report.json, validation, inspect, bench/eval JSON), `inputs.py` reads the
untrusted files, `plots.py` draws matplotlib figures as inline SVG, `page.py` renders the Jinja2 template
in `templates/`. matplotlib and jinja2 are imported only when a page is rendered (the `report` extra).
"""

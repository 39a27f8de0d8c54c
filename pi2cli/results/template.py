"""The jinja2 template of the HTML report (kept in Python so it ships with the package as is).

The page loads nothing from outside: styles are inline and plots are data: URIs. A small script records
on <body> how many images decoded and any script error, so a headless browser can check the page.
"""

HTML_TEMPLATE = """{#- one titled table per group (runs, comparison): the same markup so the same styles apply -#}
{% macro group_tables(groups, headers, kind) %}{% for group, rows in groups %}
<h3 class="group">{{ group }}</h3>
<div class="scroll"><table class="{{ kind }}">
<thead><tr>{% for h in headers %}<th>{{ h }}</th>{% endfor %}</tr></thead>
<tbody>{% for row in rows %}<tr>{% for cell in row %}<td>{{ cell }}</td>{% endfor %}</tr>
{% endfor %}</tbody>
</table></div>
{% endfor %}{% endmacro -%}
<!DOCTYPE html>
<html lang="en">
<head>
<meta charset="utf-8">
<meta name="viewport" content="width=device-width, initial-scale=1">
<title>{{ title }}</title>
<style>
 body { font-family: system-ui, -apple-system, "Segoe UI", sans-serif; margin: 2em auto; max-width: 1200px;
        padding: 0 1em; color: #222; }
 h1 { margin-bottom: 0.2em; }
 .meta { color: #666; }
 .synthetic { background: #fff3cd; border: 1px solid #e0c060; padding: 0.5em 1em; border-radius: 4px; }
 table { border-collapse: collapse; margin: 1em 0; font-size: 0.85em; }
 th, td { border: 1px solid #ccc; padding: 0.3em 0.6em; text-align: left; vertical-align: top; }
 th { background: #f2f2f2; }
 tr:nth-child(even) td { background: #fafafa; }
 figure { margin: 1.5em 0; }
 figure img { max-width: 100%; height: auto; border: 1px solid #eee; }
 figcaption { color: #555; font-size: 0.9em; }
 .notes li { color: #8a5a00; }
 .scroll { overflow-x: auto; }
 h3.group { font-size: 1em; margin: 1.2em 0 0; }
 /* Runs fit a 1400 px window: long ids and errors wrap instead of widening the table. */
 table.runs td, table.comparison td { overflow-wrap: anywhere; }
 table.runs td:first-child { min-width: 9em; max-width: 13em; }
 table.runs td:nth-child(4) { max-width: 16em; }
 table.runs td:nth-child(2), table.comparison td:first-child { overflow-wrap: normal; white-space: nowrap; }
 table.comparison td:last-child { max-width: 13em; }
</style>
</head>
<body>
<h1>{{ title }}</h1>
<p class="meta">Generated {{ generated }} from {{ n_runs }} run(s).</p>
{% if synthetic %}
<p class="synthetic"><strong>Synthetic models are marked [synthetic]:</strong> their weights are generated,
so their speed says nothing about output quality.</p>
{% endif %}

<h2>Runs</h2>
<p class="meta">One table per group: model · workload · memory budget · device · threads.</p>
{{ group_tables(run_groups, run_headers, "runs") }}

{% if compare_groups %}
<h2>Comparison</h2>
{{ group_tables(compare_groups, compare_headers, "comparison") }}
<p>{{ compare_note }}</p>
{% endif %}
{% if notes %}<ul class="notes">{% for note in notes %}<li>{{ note }}</li>{% endfor %}</ul>{% endif %}

{% for plot in plots %}
<h2>{{ plot.title }}</h2>
<figure id="plot-{{ plot.name }}">
<img src="{{ plot.data_uri }}" alt="{{ plot.title }}">
<figcaption>{{ plot.caption }}</figcaption>
</figure>
{% endfor %}

<h2>How it was measured</h2>
<ul>{% for engine, how in measurements %}<li><strong>{{ engine }}</strong>: {{ how }}</li>{% endfor %}</ul>
<h2>Engines</h2>
<ul>{% for line in engines %}<li>{{ line }}</li>{% endfor %}</ul>

<script>
(function () {
  var errors = [];
  window.addEventListener("error", function (e) { errors.push(String(e.message || e)); });
  window.addEventListener("load", function () {
    var images = Array.prototype.slice.call(document.images);
    var loaded = images.filter(function (img) { return img.complete && img.naturalWidth > 0; }).length;
    document.body.setAttribute("data-images-total", String(images.length));
    document.body.setAttribute("data-images-loaded", String(loaded));
    document.body.setAttribute("data-images-broken", String(images.length - loaded));
    document.body.setAttribute("data-script-errors", String(errors.length));
    var overflow = 0;  // the widest overflow of any Runs table's box
    document.querySelectorAll("table.runs").forEach(function (t) {
      overflow = Math.max(overflow, t.parentElement.scrollWidth - t.parentElement.clientWidth);
    });
    document.body.setAttribute("data-runs-overflow", String(overflow));
    document.body.setAttribute("data-run-groups", String(document.querySelectorAll("table.runs").length));
    document.body.setAttribute("data-render-check", "done");
  });
})();
</script>
</body>
</html>
"""

"""The page around the charts: style, hover script, embedded data blocks, small widgets."""

from __future__ import annotations

import json
import math
from collections.abc import Iterable, Mapping, Sequence
from html import escape
from typing import Any

CSS = """
:root{--fg:#1d2330;--muted:#667085;--line:#e4e7ec;--bg:#f6f7f9;--card:#fff;
--high:#d92d20;--medium:#dc6803;--low:#1570ef;--info:#079455}
*{box-sizing:border-box}
body{margin:0;background:var(--bg);color:var(--fg);
font:14px/1.45 -apple-system,BlinkMacSystemFont,"Segoe UI",Roboto,Helvetica,Arial,sans-serif}
main{max-width:1320px;margin:0 auto;padding:24px 28px 60px}
header h1{font-size:22px;margin:0 0 2px}
header .sub{color:var(--muted);font-size:13px}
.badge{display:inline-block;padding:1px 8px;border-radius:10px;font-size:12px;
font-weight:600;color:#fff;vertical-align:middle;margin-left:8px}
.s-completed{background:#079455}.s-running{background:#1570ef}.s-failed{background:#d92d20}
.s-preempted{background:#dc6803}
.verdict{margin-top:12px;padding:9px 14px;border-radius:8px;font-size:14px;
background:#fff;border:1px solid var(--line)}
.verdict b{margin-right:6px}.verdict.high b{color:var(--high)}
.verdict.medium b{color:var(--medium)}.verdict.low b{color:var(--low)}
.verdict.info b{color:var(--info)}
.kpis{display:grid;grid-template-columns:repeat(auto-fill,minmax(150px,1fr));gap:10px;
margin:18px 0}
.kpi{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:10px 12px}
.kpi b{display:block;font-size:20px;font-variant-numeric:tabular-nums}
.kpi span{color:var(--muted);font-size:12px;text-transform:uppercase;letter-spacing:.04em}
.finding{background:var(--card);border:1px solid var(--line);border-left:5px solid;
border-radius:8px;padding:12px 16px;margin:10px 0}
.finding.high{border-left-color:var(--high)}.finding.medium{border-left-color:var(--medium)}
.finding.low{border-left-color:var(--low)}.finding.info{border-left-color:var(--info)}
.finding h3{margin:0 0 4px;font-size:15px}
.finding h3 small{font-weight:600;text-transform:uppercase;font-size:11px;margin-left:8px}
.finding.high small{color:var(--high)}.finding.medium small{color:var(--medium)}
.finding.low small{color:var(--low)}.finding.info small{color:var(--info)}
.finding ul{margin:6px 0 0;padding-left:20px;color:#344054}
.finding code,td code{background:#f2f4f7;padding:0 4px;border-radius:4px;font-size:12.5px}
h2{font-size:16px;margin:28px 0 10px;padding-bottom:6px;border-bottom:1px solid var(--line)}
.grid{display:grid;grid-template-columns:repeat(auto-fit,minmax(560px,1fr));gap:14px}
.card{background:var(--card);border:1px solid var(--line);border-radius:8px;padding:12px 14px}
.card h4{margin:0 0 2px;font-size:14px}.card .note{color:var(--muted);font-size:12px;margin:0}
.legend{display:flex;flex-wrap:wrap;gap:4px 14px;font-size:12px;color:#344054;margin:6px 0}
.key i,.tip i{display:inline-block;width:10px;height:10px;border-radius:2px;margin-right:5px;
vertical-align:-1px}
svg.chart{width:100%;height:auto;display:block;font-size:11px}
svg .grid{stroke:#eef0f3}svg .axis{stroke:#98a2b3}svg .tick{fill:#667085}
svg .label{fill:#475467;font-size:11.5px}
svg .series{fill:none;stroke-width:1.8;stroke-linejoin:round}
svg .mark{stroke-width:1.2;stroke-dasharray:3 3;opacity:.8}
svg .cross{stroke:#98a2b3;stroke-width:1;visibility:hidden}
.tip{position:fixed;pointer-events:none;background:#101828;color:#fff;font-size:12px;
padding:6px 9px;border-radius:6px;display:none;z-index:9;box-shadow:0 4px 12px #0003}
.tip table td{padding:0 4px}.tip td:last-child{text-align:right;font-variant-numeric:tabular-nums}
table.kv,table.list{border-collapse:collapse;width:100%;font-size:13px}
table.kv td,table.list td,table.list th{border-bottom:1px solid var(--line);padding:4px 8px;
text-align:left;vertical-align:top}
table.list th{color:var(--muted);font-weight:600;font-size:12px;background:#fafbfc}
table.list td.num{text-align:right;font-variant-numeric:tabular-nums}
table.kv td:first-child{color:var(--muted);white-space:nowrap;width:38%}
.empty{color:var(--muted);font-style:italic}
.scale{display:flex;align-items:center;gap:6px;font-size:12px;color:var(--muted)}
.scale i{display:inline-block;width:120px;height:10px;border-radius:2px;
background:linear-gradient(90deg,#4269d0,#fff,#d62728)}
footer{color:var(--muted);font-size:12px;margin-top:30px}
"""

# Hover read-out: maps the pointer to a step through the chart's data-* plot area and
# lists every series' value there from the chart's embedded JSON block.
SCRIPT = """
(function(){
const tip=document.createElement('div');tip.className='tip';document.body.appendChild(tip);
const esc=s=>String(s).replace(/[&<>"]/g,c=>({'&':'&amp;','<':'&lt;','>':'&gt;','"':'&quot;'}[c]));
function fmt(v,unit){if(v===null||v===undefined)return 'NaN';const a=Math.abs(v);
 if(unit==='bytes'){const u=['B','KiB','MiB','GiB','TiB'];let i=0,x=v;
  while(Math.abs(x)>=1024&&i<4){x/=1024;i++}return x.toFixed(2)+' '+u[i]}
 if(unit==='s'&&a<1)return (v*1000).toPrecision(3)+' ms';
 if(a>=1e9)return (v/1e9).toPrecision(3)+'G';if(a>=1e6)return (v/1e6).toPrecision(3)+'M';
 if(a>=1e4)return (v/1e3).toPrecision(3)+'k';if(a!==0&&a<1e-3)return v.toExponential(2);
 return Number(v.toPrecision(4)).toString()}
function near(xs,x){let lo=0,hi=xs.length-1;while(hi-lo>1){const m=(lo+hi)>>1;
 if(xs[m]<x)lo=m;else hi=m}return Math.abs(xs[lo]-x)<=Math.abs(xs[hi]-x)?lo:hi}
document.querySelectorAll('svg.chart[data-src]').forEach(svg=>{
 const el=document.getElementById(svg.dataset.src);if(!el)return;
 const d=JSON.parse(el.textContent);if(!d.series)return;
 const x0=+svg.dataset.x0,x1=+svg.dataset.x1,p0=+svg.dataset.px0,p1=+svg.dataset.px1;
 const cross=document.createElementNS('http://www.w3.org/2000/svg','line');
 cross.setAttribute('class','cross');cross.setAttribute('y1',svg.dataset.top);
 cross.setAttribute('y2',svg.dataset.bottom);svg.appendChild(cross);
 const hide=()=>{tip.style.display='none';cross.style.visibility='hidden'};
 svg.addEventListener('mouseleave',hide);
 svg.addEventListener('mousemove',e=>{const r=svg.getBoundingClientRect();
  const px=(e.clientX-r.left)/r.width*svg.viewBox.baseVal.width;
  if(px<p0||px>p1){hide();return}const x=x0+(px-p0)/(p1-p0)*(x1-x0);let best=null;
  d.series.forEach(s=>{if(!s.x.length)return;const i=near(s.x,x);
   if(best===null||Math.abs(s.x[i]-x)<Math.abs(best-x))best=s.x[i]});
  if(best===null)return;
  const rows=d.series.map(s=>{const i=s.x.indexOf(best);if(i<0)return '';
   return '<tr><td><i style="background:'+s.color+'"></i>'+esc(s.name)+'</td><td>'+
   fmt(s.y[i],d.unit)+'</td></tr>'}).join('');
  tip.innerHTML='<b>'+esc(d.x_label||'step')+' '+best+'</b><table>'+rows+'</table>';
  tip.style.display='block';tip.style.left=Math.min(e.clientX+14,innerWidth-220)+'px';
  tip.style.top=(e.clientY+14)+'px';const cx=p0+(best-x0)/(x1-x0)*(p1-p0);
  cross.setAttribute('x1',cx);cross.setAttribute('x2',cx);cross.style.visibility='visible'});
});
})();
"""


def clean(value: Any) -> Any:
    """JSON-safe copy: NaN and infinities become null (JSON has no NaN)."""
    if isinstance(value, float):
        return value if math.isfinite(value) else None
    if isinstance(value, Mapping):
        return {str(k): clean(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [clean(v) for v in value]
    return value


def data_block(data_id: str, payload: Mapping[str, Any]) -> str:
    """A `<script type="application/json" id=...>` block holding a chart's numbers."""
    text = json.dumps(clean(payload), allow_nan=False, default=str, separators=(",", ":"))
    # "</" inside a script element would end it early; "<\\/" is the same JSON string.
    text = text.replace("</", "<\\/")
    return f'<script type="application/json" id="{escape(data_id)}">{text}</script>'


def page(title: str, body: str) -> str:
    """The whole HTML document: style, body, then the hover script."""
    return (f'<!DOCTYPE html><html lang="en"><head><meta charset="utf-8">'
            f'<meta name="viewport" content="width=device-width,initial-scale=1">'
            f"<title>{escape(title)}</title><style>{CSS}</style></head><body><main>{body}"
            f"</main><script>{SCRIPT}</script></body></html>")


def card(title: str, content: str, note: str = "") -> str:
    """A titled panel (a chart and its legend, a table)."""
    extra = f'<p class="note">{escape(note)}</p>' if note else ""
    return f'<section class="card"><h4>{escape(title)}</h4>{extra}{content}</section>'


def kpis(items: Iterable[tuple[str, str]]) -> str:
    """The row of headline numbers."""
    tiles = "".join(f'<div class="kpi"><span>{escape(label)}</span><b>{escape(value)}</b></div>'
                    for label, value in items)
    return f'<div class="kpis">{tiles}</div>'


def kv_table(mapping: Mapping[str, Any], prefix: str = "") -> str:
    """Nested mapping as a two-column table of dotted keys."""
    rows = "".join(f"<tr><td>{escape(k)}</td><td><code>{escape(v)}</code></td></tr>"
                   for k, v in flatten(mapping, prefix))
    return f'<table class="kv">{rows}</table>' if rows else '<p class="empty">none</p>'


def flatten(mapping: Mapping[str, Any], prefix: str = "") -> list[tuple[str, str]]:
    """(dotted key, text) pairs of a nested mapping, in order."""
    out: list[tuple[str, str]] = []
    for key, value in mapping.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            out.extend(flatten(value, name + "."))
        else:
            out.append((name, json.dumps(value, default=str)
                        if not isinstance(value, str) else value))
    return out


def list_table(header: Sequence[str], rows: Iterable[Sequence[str]],
               numeric: Sequence[bool] = ()) -> str:
    """A table with a header row; `numeric` columns are right-aligned."""
    head = "".join(f"<th>{escape(h)}</th>" for h in header)
    body = []
    for row in rows:
        cells = "".join(
            f'<td class="num">{escape(c)}</td>' if i < len(numeric) and numeric[i]
            else f"<td>{escape(c)}</td>" for i, c in enumerate(row))
        body.append(f"<tr>{cells}</tr>")
    if not body:
        return '<p class="empty">none</p>'
    return f'<table class="list"><tr>{head}</tr>{"".join(body)}</table>'

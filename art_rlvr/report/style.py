"""The page's stylesheet, inlined in the page: no external file, font or script to fetch."""

CSS = """
body{font:14px/1.45 system-ui,sans-serif;margin:0 auto;max-width:1200px;padding:0 16px 48px;
color:#222}
h1{margin:16px 0 4px}h2{border-bottom:1px solid #ddd;padding-bottom:4px;margin-top:32px}
h3{font-size:14px;margin:14px 0 6px}.sub{color:#555;margin:0 0 12px}
.alarm{background:#fff3e0;border:2px solid #e65100;border-radius:6px;padding:4px 16px}
.alarm h2{color:#b71c1c;border:none;margin-top:8px}
.note{background:#e3f2fd;border-radius:6px;padding:6px 16px}
.cards{display:flex;flex-wrap:wrap;gap:8px}.card{border:1px solid #ddd;border-radius:6px;
padding:6px 10px;min-width:120px}.card b{display:block;font-size:18px}.card span{color:#666;
font-size:12px}
table{border-collapse:collapse;font-size:13px}td,th{border:1px solid #ddd;padding:3px 7px;
text-align:left;vertical-align:top}th{background:#f5f5f5}.scroll{overflow-x:auto}
pre{white-space:pre-wrap;word-break:break-word;background:#f7f7f7;padding:6px 8px;
border-radius:4px;margin:4px 0}pre.completion{background:#eef6ee}pre.feedback{background:#fdf5e6}
figure{margin:12px 0}figure img{max-width:100%;border:1px solid #eee}figcaption{color:#555;
font-size:12px}
details{margin:4px 0;border:1px solid #e5e5e5;border-radius:4px;padding:2px 8px}
summary{cursor:pointer;padding:2px 0}.traj{border-left:3px solid #90caf9;margin:8px 0;
padding-left:10px}.label{margin:6px 0 0;color:#555;font-size:12px}.small{color:#666;
font-size:12px}.role{font-weight:bold;font-size:12px;color:#555}
.diff{white-space:pre-wrap;background:#f7f7f7;padding:6px 8px;border-radius:4px;
font-family:monospace}del{background:#ffcdd2;text-decoration:line-through}
ins{background:#c8e6c9;text-decoration:none}del,ins{padding:0 2px}
.change{border-left:3px solid #66bb6a;
padding-left:10px;margin:10px 0}
.episode .msg{margin:4px 0}.episode .result{margin-left:24px}pre.call{background:#ede7f6}
pre.tool{background:#eceff1}pre.env{background:#fff8e1}
.filters{display:flex;flex-wrap:wrap;gap:6px 16px;margin:8px 0}.filters label{font-size:13px}
details.rollout summary.ok{border-left:4px solid #66bb6a;padding-left:6px}
details.rollout summary.bad{border-left:4px solid #ef5350;padding-left:6px}
.msg.result{margin-left:24px}
"""

"""`pgworkerd web`: the operators' dashboard (README "Web dashboard").

Server-rendered pages (Flask, Jinja2 autoescaping) served by waitress; live parts of a
page are HTML fragments the server renders and a 40-line script of ours polls (static/
live.js), so there is no front-end build and the Content-Security-Policy allows no inline
script. Modules: passwords (the [web.users] hashes), auth (login throttling, device tokens
and server-side sessions), db (the connection pool), server (binding rules, waitress), app
(the Flask application, put together from its parts: login (login, CSRF, the guard, the
headers), pages, actions, filters; context holds what they share).

Only `passwords` is imported without the `web` extra (the config checks hashes with it).
"""

-- wrk script: a small completion POST, the overhead-bench request.
wrk.method = "POST"
wrk.body   = '{"prompt":"hi","max_tokens":1}'
wrk.headers["Content-Type"] = "application/json"

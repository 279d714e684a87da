#!/usr/bin/env bash
# Text mode (wire-v1 section 5) driven with nc: every request kind and every bad-input case.
source "$(dirname "$0")/lib.bash"
start_server --max-frame 256

text_session "call echo" '{"id":1,"call":"switchboard/echo","method":"echo","args":{"a":[1,2.5,"x",null,true]}}\n' \
'{"id":1,"result":{"a":[1,2.5,"x",null,true]}}'
text_session "call fail" '{"id":"f","call":"switchboard/echo","method":"fail","args":[1]}\n' \
'{"id":"f","error":{"code":"demo_error","message":"requested failure","details":[1]}}'
text_session "call json channel" '{"id":2,"call":"switchboard/echo.json","method":"echo","args":{"k":"v"}}\n' \
'{"id":2,"result":{"k":"v"}}'
text_session "not implemented" '{"id":3,"call":"switchboard/echo","method":"nope"}\n{"id":4,"call":"no/such","method":"x"}\n' \
'{"id":3,"notImplemented":true}
{"id":4,"notImplemented":true}'
text_session "listen ticker" '{"id":5,"listen":"switchboard/ticker","args":{"count":3,"intervalMs":5}}\n' \
'{"id":5,"result":null}
{"event":"switchboard/ticker","data":0}
{"event":"switchboard/ticker","data":1}
{"event":"switchboard/ticker","data":2}
{"event":"switchboard/ticker","end":true}' 0.5
text_session "listen then cancel" '{"id":6,"listen":"switchboard/room"}\n{"id":7,"cancel":"switchboard/room"}\n{"id":8,"cancel":"switchboard/room"}\n' \
'{"id":6,"result":null}
{"id":7,"result":null}
{"id":8,"error":{"code":"error","message":"No active stream to cancel","details":null}}' 0.3
text_session "listen refused" '{"id":9,"listen":"switchboard/ticker","args":{"count":-1}}\n' \
'{"id":9,"error":{"code":"bad_arguments","message":"count must be a non-negative integer","details":null}}'
text_session "send" '{"id":10,"send":"switchboard/message","message":{"n":[1,2]}}\n{"id":11,"send":"switchboard/message.string","message":"héllo"}\n' \
'{"id":10,"reply":{"n":[1,2]}}
{"id":11,"reply":"héllo"}'
text_session "send binary" '{"id":12,"send":"switchboard/message.binary","message":[0,255]}\n{"id":13,"send":"switchboard/message.binary","message":"hi"}\n{"id":14,"send":"switchboard/message.binary"}\n' \
'{"id":12,"reply":[0,255]}
{"id":13,"reply":[104,105]}
{"id":14,"reply":null}'
text_session "send to nothing" '{"id":15,"send":"no/such","message":1}\n' '{"id":15,"reply":null}'
text_session "ping and demand" '{"id":16,"ping":true}\n{"id":17,"demand":"switchboard/ticker","n":10}\n{"id":18,"demand":"switchboard/ticker","n":-1}\n' \
'{"id":16,"pong":true}
{"id":17,"result":null}
{"id":18,"result":null}'
text_session "demand credit paces a listen" '{"demand":"switchboard/ticker","n":2}\n{"id":19,"listen":"switchboard/ticker","args":{"intervalMs":0}}\n' \
'{"result":null}
{"id":19,"result":null}
{"event":"switchboard/ticker","data":0}
{"event":"switchboard/ticker","data":1}' 0.3
text_session "hello" '{"hello":{"version":1}}\n' \
'{"welcome":{"version":1,"server":"switchboard/0.1.0","maxFrame":256,"heartbeatMs":0}}'
text_session "crlf and blank lines" '{"id":20,"ping":true}\r\n\n   \n\r\n{"id":21,"ping":true}\n' \
'{"id":20,"pong":true}
{"id":21,"pong":true}'
text_session "room post reaches a text listener" '{"id":22,"listen":"switchboard/room"}\n{"id":23,"send":"switchboard/room.post","message":[7,8]}\n' \
'{"id":22,"result":null}
{"event":"switchboard/room","data":[7,8]}
{"id":23,"reply":null}' 0.3

# Bad input: each gets bad_request (with the id when it could be read) and the connection keeps working.
long=$(printf 'x%.0s' $(seq 1 400))
text_session "bad lines" "{\"id\":29,\"ping\":true}\nnot json\n[1,2]\n{\"id\":30}\n{\"id\":31,\"call\":\"switchboard/echo\"}\n{\"id\":32,\"demand\":\"t\",\"n\":0}\n{\"id\":33,\"ping\":true,\"call\":\"x\"}\n{\"id\":[1],\"ping\":true}\n{\"id\":34,\"send\":\"switchboard/message.binary\",\"message\":[256]}\n{\"id\":35,\"call\":\"switchboard/message\",\"method\":\"m\"}\n{\"id\":36,\"call\":\"${long}\"}\n{\"id\":37,\"ping\":true}\n\xff\xfe\n{\"id\":38,\"ping\":true}\n" \
'{"id":29,"pong":true}
{"error":{"code":"bad_request","message":"invalid JSON: invalid literal at offset 1"}}
{"error":{"code":"bad_request","message":"a request is a JSON object"}}
{"id":30,"error":{"code":"bad_request","message":"a request needs exactly one of call, listen, cancel, send, ping, demand, hello"}}
{"id":31,"error":{"code":"bad_request","message":"\"call\" needs a \"method\" string"}}
{"id":32,"error":{"code":"bad_request","message":"\"n\" must be a positive integer or -1"}}
{"id":33,"error":{"code":"bad_request","message":"a request needs exactly one of call, listen, cancel, send, ping, demand, hello"}}
{"error":{"code":"bad_request","message":"id must be a number or a string"}}
{"id":34,"error":{"code":"bad_payload","message":"message could not be decoded: a binary message is a list of numbers 0-255 at offset 0"}}
{"id":35,"error":{"code":"bad_request","message":"switchboard/message is a message channel: use \"send\""}}
{"error":{"code":"bad_request","message":"line longer than 256 bytes"}}
{"id":37,"pong":true}
{"error":{"code":"bad_request","message":"invalid JSON: unexpected character at offset 0"}}
{"id":38,"pong":true}'

stop_server
start_server --token s3cret
text_session "token required (the refused request's id is echoed)" '{"id":1,"call":"switchboard/echo","method":"echo"}\n' \
'{"id":1,"error":{"code":"unauthorized","message":"a valid token is required"}}'
text_session "wrong token" '{"hello":{"token":"nope"}}\n{"id":2,"ping":true}\n' \
'{"error":{"code":"unauthorized","message":"a valid token is required"}}'
text_session "right token" '{"hello":{"version":1,"token":"s3cret"}}\n{"id":3,"call":"switchboard/echo","method":"echo","args":1}\n' \
'{"welcome":{"version":1,"server":"switchboard/0.1.0","maxFrame":16777216,"heartbeatMs":0}}
{"id":3,"result":1}'
text_session "bad hello" '{"hello":[1]}\n' '{"error":{"code":"bad_hello","message":"hello must be a JSON object"}}'

stop_server
start_server --no-demo
text_session "no demo channels" '{"id":1,"call":"switchboard/echo","method":"echo","args":1}\n' '{"id":1,"notImplemented":true}'
finish

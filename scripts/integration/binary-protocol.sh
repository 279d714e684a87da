#!/usr/bin/env bash
# The binary protocol (wire-v1 section 2) driven with printf, xxd and nc.
source "$(dirname "$0")/lib.bash"

# frame TYPE FLAGS ID CHANNEL [PAYLOAD_HEX]: one frame as hex (big-endian header).
frame() {
    local type=$1 flags=$2 id=$3 channel=$4 payload=${5:-}
    local channel_hex; channel_hex=$(hex_of "$channel")
    local length=$(( 8 + ${#channel_hex} / 2 + ${#payload} / 2 ))
    printf '%08x%02x%02x%04x%08x%s%s' "$length" "$type" "$flags" $(( ${#channel_hex} / 2 )) "$id" "$channel_hex" "$payload"
}
# json_error CODE MESSAGE ID: the ERROR frame the server sends.
json_error() { frame 7 0 "$3" "" "$(hex_of "{\"code\":\"$1\",\"message\":\"$2\"}")"; }

start_server

# StandardMethodCodec call echo("hi"), spelled out: length 0x22 = 8 + 16 (channel) + 10 (payload).
binary_session "echo, literal bytes" \
    "00000022 03 00 0010 00000001 $(hex_of switchboard/echo) 07 04 6563686f 07 02 6869" \
    "0000000d 04 00 0000 00000001 00 07 02 6869"
binary_session "fail → error envelope" \
    "$(frame 3 0 2 switchboard/echo 07046661696c00)" \
    "$(frame 4 0 2 "" "01070a$(hex_of demo_error)0711$(hex_of 'requested failure')00")"
binary_session "not implemented → null reply" \
    "$(frame 3 0 3 switchboard/echo 07046e6f706500)" "$(frame 4 1 3 "")"
binary_session "no handler → null reply" "$(frame 3 0 4 no/such 07016d00)" "$(frame 4 1 4 "")"
binary_session "ping → pong with the same payload" "$(frame 5 0 9 "" abcd)$(frame 5 1 10 "")" \
    "$(frame 6 0 9 "" abcd)$(frame 6 1 10 "")"
binary_session "binary message, empty and null" \
    "$(frame 3 0 5 switchboard/message.binary 010203)$(frame 3 0 6 switchboard/message.binary)$(frame 3 1 7 switchboard/message.binary)" \
    "$(frame 4 0 5 "" 010203)$(frame 4 0 6 "")$(frame 4 1 7 "")"
binary_session "hello → welcome" "$(frame 1 0 8 "" "$(hex_of '{"version":1}')")" \
    "$(frame 2 0 8 "" "$(hex_of '{"version":1,"server":"switchboard/0.1.0","maxFrame":16777216,"heartbeatMs":0}')")"
# listen({"count": 2, "intervalMs": 1}): string "listen", then a map of 2 entries with int32 values.
listen_call="0706$(hex_of listen)0d02"
listen_call+="0705$(hex_of count)0302000000"
listen_call+="070a$(hex_of intervalMs)0301000000"
binary_session "ticker stream: reply, 2 events, end" "$(frame 3 0 11 switchboard/ticker "$listen_call")" \
    "$(frame 4 0 11 "" 0000)$(frame 3 0 0 switchboard/ticker 000300000000)$(frame 3 0 0 switchboard/ticker 000301000000)$(frame 3 1 0 switchboard/ticker)" 0.5
binary_session "bad frame keeps the connection" "$(frame 15 0 12 "")$(frame 5 0 13 "")" \
    "$(json_error bad_frame 'unknown frame type 15' 12)$(frame 6 0 13 "")"
binary_session "malformed frame closes, with the id its header carries" "00000004 03 00 0000 0000000e" \
    "$(json_error malformed_frame 'length 4 is less than 8' 14)"
binary_session "frame too large closes before the body" "7fffffff" \
    "$(json_error frame_too_large "frame of 2147483647 bytes exceeds the server's maxFrame" 0)"
finish

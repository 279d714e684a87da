/*
 * The bare single-threaded libuv baseline for `switchboard bench rpc`: it answers the same frames as
 * Switchboard's `switchboard/echo` channel and nothing else, with no framework, no codec and no
 * allocation per call. HELLO gets a WELCOME; a MESSAGE calling `echo` with a Uint8List (what the bench
 * sends) gets a REPLY whose success envelope holds the argument's bytes as sent; anything else is "not
 * implemented" (other values may hold 8-byte-aligned parts, which copying to a new offset would break).
 * Replies made during one read callback leave in one write.
 *
 *   cc -O2 -o libuv-echo echo.c $(pkg-config --cflags --libs libuv) && ./libuv-echo PORT
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <uv.h>

enum { HEADER = 12, HELLO = 1, WELCOME = 2, MESSAGE = 3, REPLY = 4, NULL_PAYLOAD = 1 };

typedef struct {
    uint8_t *bytes;
    size_t count, capacity;
} buffer_t;

typedef struct {
    uv_tcp_t tcp;
    buffer_t in, out;
} connection_t;

static uv_loop_t *loop;
static char read_area[64 * 1024];

static void reserve(buffer_t *b, size_t more) {
    if (b->count + more <= b->capacity) return;
    size_t capacity = b->capacity ? b->capacity : 4096;
    while (capacity < b->count + more) capacity *= 2;
    b->bytes = realloc(b->bytes, capacity);
    if (!b->bytes) abort();
    b->capacity = capacity;
}

static uint32_t u32(const uint8_t *p) { return (uint32_t)p[0] << 24 | (uint32_t)p[1] << 16 | (uint32_t)p[2] << 8 | p[3]; }

static void put_u32(uint8_t *p, uint32_t v) {
    p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v;
}

/* Appends a frame with no channel; `body` may be NULL (with `null_payload`) or `length` bytes after `prefix`. */
static void reply(buffer_t *out, uint8_t type, uint32_t id, int has_prefix, const uint8_t *body, size_t length, int null_payload) {
    size_t payload = (has_prefix ? 1 : 0) + length;
    reserve(out, HEADER + payload);
    uint8_t *p = out->bytes + out->count;
    put_u32(p, (uint32_t)(8 + payload));
    p[4] = type; p[5] = null_payload ? NULL_PAYLOAD : 0; p[6] = 0; p[7] = 0;
    put_u32(p + 8, id);
    if (has_prefix) p[HEADER] = 0x00; /* success envelope */
    if (length) memcpy(p + HEADER + (has_prefix ? 1 : 0), body, length);
    out->count += HEADER + payload;
}

/* A StandardMessageCodec string's encoded size (type 7, size, UTF-8), or 0 if it is not one. */
static size_t string_size(const uint8_t *p, size_t n) {
    if (n < 2 || p[0] != 7) return 0;
    size_t size, header;
    if (p[1] < 254) { size = p[1]; header = 2; }
    else if (p[1] == 254 && n >= 4) { size = p[2] | (size_t)p[3] << 8; header = 4; }
    else return 0;
    return header + size <= n ? header + size : 0;
}

static void on_close(uv_handle_t *handle) {
    connection_t *c = (connection_t *)handle;
    free(c->in.bytes);
    free(c->out.bytes);
    free(c);
}

static void on_written(uv_write_t *request, int status) {
    (void)status;
    free(request->data);
    free(request);
}

static void flush(connection_t *c) {
    if (!c->out.count) return;
    uv_buf_t buf = uv_buf_init((char *)c->out.bytes, (unsigned)c->out.count);
    int written = uv_try_write((uv_stream_t *)&c->tcp, &buf, 1);
    if (written < 0 && written != UV_EAGAIN) { uv_close((uv_handle_t *)&c->tcp, on_close); return; }
    size_t sent = written > 0 ? (size_t)written : 0;
    if (sent < c->out.count) { /* the rest waits in a write request that owns a copy */
        uv_write_t *request = malloc(sizeof *request);
        size_t rest = c->out.count - sent;
        request->data = malloc(rest);
        memcpy(request->data, c->out.bytes + sent, rest);
        uv_buf_t tail = uv_buf_init(request->data, (unsigned)rest);
        uv_write(request, (uv_stream_t *)&c->tcp, &tail, 1, on_written);
    }
    c->out.count = 0;
}

static void on_alloc(uv_handle_t *handle, size_t suggested, uv_buf_t *buf) {
    (void)handle; (void)suggested;
    *buf = uv_buf_init(read_area, sizeof read_area);
}

static void on_read(uv_stream_t *stream, ssize_t nread, const uv_buf_t *buf) {
    connection_t *c = (connection_t *)stream;
    if (nread < 0) { uv_close((uv_handle_t *)stream, on_close); return; }
    reserve(&c->in, (size_t)nread);
    memcpy(c->in.bytes + c->in.count, buf->base, (size_t)nread);
    c->in.count += (size_t)nread;

    size_t at = 0;
    while (c->in.count - at >= HEADER) {
        const uint8_t *f = c->in.bytes + at;
        uint32_t length = u32(f);
        if (length < 8 || length > (1u << 24)) { uv_close((uv_handle_t *)stream, on_close); return; }
        if (c->in.count - at < 4 + (size_t)length) break;
        uint32_t id = u32(f + 8);
        size_t channel = (size_t)f[6] << 8 | f[7];
        const uint8_t *payload = f + HEADER + channel;
        size_t payload_size = 4 + (size_t)length - HEADER - channel;
        if (f[4] == HELLO) {
            static const char welcome[] = "{\"version\":1,\"server\":\"libuv-echo\"}";
            reply(&c->out, WELCOME, id, 0, (const uint8_t *)welcome, sizeof welcome - 1, 0);
        } else if (f[4] == MESSAGE && id != 0) {
            size_t method = string_size(payload, payload_size);
            if (method == 6 && memcmp(payload + 2, "echo", 4) == 0 && payload_size > method && payload[method] == 8)
                reply(&c->out, REPLY, id, 1, payload + method, payload_size - method, 0);
            else
                reply(&c->out, REPLY, id, 0, NULL, 0, 1); /* not implemented */
        }
        at += 4 + length;
    }
    memmove(c->in.bytes, c->in.bytes + at, c->in.count - at);
    c->in.count -= at;
    flush(c);
}

static void on_connection(uv_stream_t *server, int status) {
    if (status < 0) return;
    connection_t *c = calloc(1, sizeof *c);
    uv_tcp_init(loop, &c->tcp);
    if (uv_accept(server, (uv_stream_t *)&c->tcp) != 0) { uv_close((uv_handle_t *)&c->tcp, on_close); return; }
    uv_tcp_nodelay(&c->tcp, 1);
    uv_read_start((uv_stream_t *)&c->tcp, on_alloc, on_read);
}

int main(int argc, char **argv) {
    int port = argc > 1 ? atoi(argv[1]) : 7421;
    loop = uv_default_loop();
    uv_tcp_t server;
    struct sockaddr_in address;
    uv_tcp_init(loop, &server);
    uv_ip4_addr("127.0.0.1", port, &address);
    int rc = uv_tcp_bind(&server, (const struct sockaddr *)&address, 0);
    if (rc == 0) rc = uv_listen((uv_stream_t *)&server, 1024, on_connection);
    if (rc != 0) { fprintf(stderr, "libuv-echo: %s\n", uv_strerror(rc)); return 1; }
    return uv_run(loop, UV_RUN_DEFAULT);
}

/*
 * An independent load client for rpc over TLS (or plain TCP): C connections, each keeping D calls of S
 * bytes in flight, against Switchboard (wire v1: HELLO, then MESSAGE frames calling `echo` with a
 * Uint8List on `switchboard/echo`, as `switchboard bench rpc` sends them) or Redis (pipelined RESP2
 * `ECHO`, as `switchboard bench rpc --target redis` sends it). One thread, one epoll loop, OpenSSL 3 with
 * TLS 1.3 only. Every answer is checked byte for byte (a REPLY with the success envelope holding the
 * same Uint8List, the id of a call in flight; or Redis's bulk string); anything else counts as an error.
 * As `switchboard bench` does, each answer read sends the next call, and the calls made for one read
 * leave in one write. It reports calls/s over DURATION seconds after WARMUP, the cipher suite
 * negotiated, and over TLS the average size of the records each way (counted by a message callback).
 *
 *   cc -O2 -o tls-client tls-client.c -lssl -lcrypto
 *   tls-client --target switchboard|redis --port N [--tls --ca ca.pem] [-c 50] [-d 16] [-s 32]
 *              [--duration 3] [--warmup 0.5] [--ciphersuites LIST] [--no-tickets]
 *
 * Output: one line of key=value pairs (rate, calls, errors, cipher, recordsIn, avgRecordIn, recordsOut,
 * avgRecordOut, repliesPerRead, resumed).
 */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <openssl/err.h>
#include <openssl/ssl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

enum { HEADER = 12, HELLO = 1, WELCOME = 2, MESSAGE = 3, REPLY = 4, MAX_DEPTH = 1024 };
static const char CHANNEL[] = "switchboard/echo";

typedef struct {
    uint8_t *bytes;
    size_t count, capacity;
} buffer_t;

typedef struct {
    int fd;
    SSL *ssl;
    buffer_t in, out;
    uint32_t next_id;
    uint32_t in_flight[MAX_DEPTH]; /* Switchboard: the ids awaiting an answer */
    int pending;
    int want_write;
} connection_t;

static int use_tls, depth = 16, size = 32, connections = 50, switchboard = 1;
static uint8_t *request;           /* one call, id field 0 for Switchboard */
static size_t request_length;
static uint8_t *expected;          /* one answer's payload (Switchboard) or whole reply (Redis) */
static size_t expected_length;
static long long completed, measured, errors, reads_with_replies, replies_in_reads;
static long long records_in, record_bytes_in, records_out, record_bytes_out;
static int measuring, counting_records;

static void die(const char *what) {
    fprintf(stderr, "tls-client: %s: %s\n", what, errno ? strerror(errno) : "");
    ERR_print_errors_fp(stderr);
    exit(1);
}

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

static void append(buffer_t *b, const void *bytes, size_t n) {
    if (b->count + n > b->capacity) {
        b->capacity = (b->count + n) * 2;
        if (!(b->bytes = realloc(b->bytes, b->capacity))) die("out of memory");
    }
    memcpy(b->bytes + b->count, bytes, n);
    b->count += n;
}

static void consume(buffer_t *b, size_t n) {
    memmove(b->bytes, b->bytes + n, b->count - n);
    b->count -= n;
}

static void put32(uint8_t *p, uint32_t v) { p[0] = v >> 24; p[1] = v >> 16; p[2] = v >> 8; p[3] = v; }
static uint32_t get32(const uint8_t *p) { return (uint32_t)p[0] << 24 | p[1] << 16 | p[2] << 8 | p[3]; }

/* The request and the answer it must get, built once. */
static void build_templates(void) {
    if (switchboard) {
        /* StandardMethodCodec: string "echo" (7, size 4), then a Uint8List (8, size S, bytes). */
        buffer_t call = {0};
        uint8_t head[] = {7, 4, 'e', 'c', 'h', 'o', 8};
        append(&call, head, sizeof head);
        uint8_t sz[5];
        size_t szn;
        if (size < 254) { sz[0] = size; szn = 1; }
        else if (size <= 0xFFFF) { sz[0] = 254; sz[1] = size; sz[2] = size >> 8; szn = 3; }
        else { sz[0] = 255; sz[1] = size; sz[2] = size >> 8; sz[3] = size >> 16; sz[4] = size >> 24; szn = 5; }
        append(&call, sz, szn);
        uint8_t *arg = malloc(size);
        memset(arg, 0x5A, size);
        append(&call, arg, size);
        /* The frame: length, MESSAGE, flags 0, chanlen, id (set per call), channel, payload. */
        buffer_t frame = {0};
        uint8_t h[HEADER] = {0};
        put32(h, 8 + sizeof CHANNEL - 1 + call.count);
        h[4] = MESSAGE;
        h[6] = (sizeof CHANNEL - 1) >> 8;
        h[7] = (sizeof CHANNEL - 1) & 0xFF;
        append(&frame, h, HEADER);
        append(&frame, CHANNEL, sizeof CHANNEL - 1);
        append(&frame, call.bytes, call.count);
        request = frame.bytes;
        request_length = frame.count;
        /* The answer's payload: the success envelope (0) and the same Uint8List. */
        buffer_t answer = {0};
        uint8_t ok = 0;
        append(&answer, &ok, 1);
        append(&answer, &head[6], 1);
        append(&answer, sz, szn);
        append(&answer, arg, size);
        expected = answer.bytes;
        expected_length = answer.count;
        free(arg);
        free(call.bytes);
    } else {
        char head[64];
        int n = snprintf(head, sizeof head, "*2\r\n$4\r\nECHO\r\n$%d\r\n", size);
        buffer_t req = {0}, rep = {0};
        append(&req, head, n);
        for (int i = 0; i < size; i++) append(&req, "Z", 1);
        append(&req, "\r\n", 2);
        n = snprintf(head, sizeof head, "$%d\r\n", size);
        append(&rep, head, n);
        for (int i = 0; i < size; i++) append(&rep, "Z", 1);
        append(&rep, "\r\n", 2);
        request = req.bytes;
        request_length = req.count;
        expected = rep.bytes;
        expected_length = rep.count;
    }
}

static void add_call(connection_t *c) {
    size_t at = c->out.count;
    append(&c->out, request, request_length);
    if (switchboard) {
        c->next_id = c->next_id >= 0x7FFFFFFE ? 1 : c->next_id + 1;
        put32(c->out.bytes + at + 8, c->next_id);
        c->in_flight[c->pending] = c->next_id;
    }
    c->pending++;
}

/* Writes what is queued; returns -1 when the connection failed. */
static int flush(connection_t *c, int epfd) {
    size_t done = 0;
    while (done < c->out.count) {
        ssize_t n;
        if (use_tls) {
            ERR_clear_error();
            n = SSL_write(c->ssl, c->out.bytes + done, c->out.count - done);
            if (n <= 0) {
                int e = SSL_get_error(c->ssl, n);
                if (e == SSL_ERROR_WANT_WRITE || e == SSL_ERROR_WANT_READ) break;
                return -1;
            }
        } else {
            n = write(c->fd, c->out.bytes + done, c->out.count - done);
            if (n < 0) {
                if (errno == EAGAIN) break;
                return -1;
            }
        }
        done += n;
    }
    consume(&c->out, done);
    int want = c->out.count > 0;
    if (want != c->want_write) {
        struct epoll_event ev = {.events = EPOLLIN | (want ? EPOLLOUT : 0), .data.ptr = c};
        epoll_ctl(epfd, EPOLL_CTL_MOD, c->fd, &ev);
        c->want_write = want;
    }
    return 0;
}

/* Checks and consumes the complete answers in c->in; returns how many, or -1 when the stream cannot be
 * followed any further. */
static int take_answers(connection_t *c) {
    size_t at = 0;
    int answers = 0;
    if (switchboard) {
        while (c->in.count - at >= HEADER) {
            const uint8_t *f = c->in.bytes + at;
            uint32_t length = get32(f);
            if (length < 8 || length > (1u << 24)) return -1;
            if (c->in.count - at < 4 + (size_t)length) break;
            uint32_t id = get32(f + 8);
            int slot = -1;
            for (int i = 0; i < c->pending; i++) if (c->in_flight[i] == id) { slot = i; break; }
            if (slot < 0) return -1; /* an answer to nothing in flight: the count would be wrong */
            c->in_flight[slot] = c->in_flight[--c->pending];
            size_t payload = length - 8;
            if (f[4] != REPLY || f[5] != 0 || f[6] != 0 || f[7] != 0 || payload != expected_length ||
                memcmp(f + HEADER, expected, expected_length) != 0)
                errors++;
            else
                answers++;
            at += 4 + length;
        }
    } else {
        while (c->in.count - at >= expected_length) {
            if (memcmp(c->in.bytes + at, expected, expected_length) != 0) {
                errors++;
                return -1; /* RESP cannot be resynchronized without parsing the unexpected reply */
            }
            c->pending--;
            answers++;
            at += expected_length;
        }
    }
    consume(&c->in, at);
    return answers;
}

/* Reads what is there; returns -1 on close or failure. */
static int fill(connection_t *c) {
    uint8_t chunk[65536];
    for (;;) {
        ssize_t n;
        if (use_tls) {
            ERR_clear_error();
            n = SSL_read(c->ssl, chunk, sizeof chunk);
            if (n <= 0) {
                int e = SSL_get_error(c->ssl, n);
                if (e == SSL_ERROR_WANT_READ || e == SSL_ERROR_WANT_WRITE) return 0;
                return -1;
            }
        } else {
            n = read(c->fd, chunk, sizeof chunk);
            if (n < 0) return errno == EAGAIN ? 0 : -1;
            if (n == 0) return -1;
        }
        append(&c->in, chunk, n);
        if ((size_t)n < sizeof chunk && !use_tls) return 0;
    }
}

/* Counts records each way from their 5-byte headers (content type, version, length). */
static void on_record(int write_p, int version, int content_type, const void *buf, size_t len, SSL *ssl, void *arg) {
    (void)version, (void)ssl, (void)arg;
    if (content_type != SSL3_RT_HEADER || len < 5 || !counting_records) return;
    const uint8_t *h = buf;
    if (h[0] != SSL3_RT_APPLICATION_DATA) return;
    size_t length = (size_t)h[3] << 8 | h[4];
    if (write_p) { records_out++; record_bytes_out += length; }
    else { records_in++; record_bytes_in += length; }
}

static void blocking_io(connection_t *c, void *bytes, size_t n, int writing) {
    size_t done = 0;
    while (done < n) {
        ssize_t r = use_tls ? (writing ? SSL_write(c->ssl, (uint8_t *)bytes + done, n - done)
                                       : SSL_read(c->ssl, (uint8_t *)bytes + done, n - done))
                            : (writing ? write(c->fd, (uint8_t *)bytes + done, n - done)
                                       : read(c->fd, (uint8_t *)bytes + done, n - done));
        if (r <= 0) die(writing ? "handshake write" : "handshake read");
        done += r;
    }
}

int main(int argc, char **argv) {
    const char *host = "127.0.0.1", *ca = NULL, *ciphersuites = NULL;
    int port = 0, no_tickets = 0;
    double duration = 3, warmup = 0.5;
    for (int i = 1; i < argc; i++) {
        const char *a = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
        if (!strcmp(a, "--tls")) { use_tls = 1; continue; }
        if (!strcmp(a, "--no-tickets")) { no_tickets = 1; continue; }
        if (!v) { fprintf(stderr, "tls-client: %s needs a value\n", a); return 2; }
        i++;
        if (!strcmp(a, "--target")) switchboard = !strcmp(v, "switchboard");
        else if (!strcmp(a, "--host")) host = v;
        else if (!strcmp(a, "--port")) port = atoi(v);
        else if (!strcmp(a, "--ca")) ca = v;
        else if (!strcmp(a, "--ciphersuites")) ciphersuites = v;
        else if (!strcmp(a, "-c")) connections = atoi(v);
        else if (!strcmp(a, "-d")) depth = atoi(v);
        else if (!strcmp(a, "-s")) size = atoi(v);
        else if (!strcmp(a, "--duration")) duration = atof(v);
        else if (!strcmp(a, "--warmup")) warmup = atof(v);
        else { fprintf(stderr, "tls-client: unknown option %s\n", a); return 2; }
    }
    if (!port || connections < 1 || depth < 1 || depth > MAX_DEPTH || size < 0) {
        fprintf(stderr, "usage: tls-client --target switchboard|redis --port N [--tls --ca FILE] [-c N] [-d N] [-s N] "
                        "[--duration S] [--warmup S] [--ciphersuites LIST] [--no-tickets]\n");
        return 2;
    }
    build_templates();

    SSL_CTX *ctx = NULL;
    if (use_tls) {
        ctx = SSL_CTX_new(TLS_client_method());
        if (!ctx) die("SSL_CTX_new");
        SSL_CTX_set_min_proto_version(ctx, TLS1_3_VERSION);
        SSL_CTX_set_max_proto_version(ctx, TLS1_3_VERSION);
        if (ciphersuites && !SSL_CTX_set_ciphersuites(ctx, ciphersuites)) die("--ciphersuites");
        if (no_tickets) SSL_CTX_set_options(ctx, SSL_OP_NO_TICKET);
        SSL_CTX_set_verify(ctx, SSL_VERIFY_PEER, NULL);
        if (ca ? !SSL_CTX_load_verify_locations(ctx, ca, NULL) : !SSL_CTX_set_default_verify_paths(ctx)) die("CA");
        SSL_CTX_set_read_ahead(ctx, 1); /* one read syscall per batch of records, not two per record */
        SSL_CTX_set_msg_callback(ctx, on_record);
    }

    int epfd = epoll_create1(0);
    connection_t *conns = calloc(connections, sizeof *conns);
    char cipher[64] = "none";
    int resumed = 0;
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons(port)};
    if (inet_pton(AF_INET, host, &addr.sin_addr) != 1) die("--host must be an IPv4 address");
    for (int i = 0; i < connections; i++) {
        connection_t *c = &conns[i];
        c->fd = socket(AF_INET, SOCK_STREAM, 0);
        int one = 1;
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        if (connect(c->fd, (struct sockaddr *)&addr, sizeof addr) < 0) die("connect");
        if (use_tls) {
            c->ssl = SSL_new(ctx);
            SSL_set_fd(c->ssl, c->fd);
            SSL_set_tlsext_host_name(c->ssl, "localhost");
            if (SSL_connect(c->ssl) != 1) die("TLS handshake");
            if (i == 0) snprintf(cipher, sizeof cipher, "%s", SSL_get_cipher_name(c->ssl));
            resumed += SSL_session_reused(c->ssl);
        }
        /* The protocol's own handshake, blocking: HELLO → WELCOME, or PING → +PONG. */
        if (switchboard) {
            uint8_t hello[HEADER] = {0};
            put32(hello, 8);
            hello[4] = HELLO;
            put32(hello + 8, 0x7FFFFFFF);
            blocking_io(c, hello, HEADER, 1);
            uint8_t head[HEADER];
            blocking_io(c, head, HEADER, 0);
            uint32_t length = get32(head);
            if (head[4] != WELCOME || length < 8 || length > 65536) { fprintf(stderr, "tls-client: no WELCOME\n"); return 1; }
            uint8_t body[65536];
            blocking_io(c, body, length - 8, 0);
        } else {
            blocking_io(c, "PING\r\n", 6, 1);
            char pong[7];
            blocking_io(c, pong, 7, 0);
            if (memcmp(pong, "+PONG\r\n", 7)) { fprintf(stderr, "tls-client: no PONG\n"); return 1; }
        }
        fcntl(c->fd, F_SETFL, fcntl(c->fd, F_GETFL) | O_NONBLOCK);
        struct epoll_event ev = {.events = EPOLLIN, .data.ptr = c};
        epoll_ctl(epfd, EPOLL_CTL_ADD, c->fd, &ev);
    }

    for (int i = 0; i < connections; i++) {
        for (int k = 0; k < depth; k++) add_call(&conns[i]);
        if (flush(&conns[i], epfd) < 0) die("write");
    }
    double start = now(), measure_start = start + warmup, end = measure_start + duration;
    struct epoll_event events[256];
    for (;;) {
        double t = now();
        if (!measuring && t >= measure_start) {
            measuring = counting_records = 1;
            measure_start = t;
            end = t + duration;
        }
        if (t >= end) break;
        int timeout = (int)(((measuring ? end : measure_start) - t) * 1000) + 1;
        int n = epoll_wait(epfd, events, 256, timeout);
        for (int e = 0; e < n; e++) {
            connection_t *c = events[e].data.ptr;
            if (events[e].events & EPOLLOUT && flush(c, epfd) < 0) die("write");
            if (!(events[e].events & (EPOLLIN | EPOLLERR | EPOLLHUP))) continue;
            if (fill(c) < 0) { fprintf(stderr, "tls-client: the server closed a connection\n"); errors++; goto done; }
            int answers = take_answers(c);
            if (answers < 0) { fprintf(stderr, "tls-client: an answer that cannot be followed\n"); errors++; goto done; }
            completed += answers;
            if (measuring) {
                measured += answers;
                if (answers) { reads_with_replies++; replies_in_reads += answers; }
            }
            while (c->pending < depth) add_call(c);
            if (flush(c, epfd) < 0) die("write");
        }
    }
done:;
    double seconds = now() - measure_start;
    printf("rate=%.0f calls=%lld errors=%lld seconds=%.3f cipher=%s resumed=%d", measuring ? measured / seconds : 0.0,
           measured, errors, seconds, cipher, resumed);
    printf(" repliesPerRead=%.2f", reads_with_replies ? (double)replies_in_reads / reads_with_replies : 0.0);
    if (use_tls)
        printf(" recordsIn=%lld avgRecordIn=%.1f recordsOut=%lld avgRecordOut=%.1f", records_in,
               records_in ? (double)record_bytes_in / records_in : 0.0, records_out,
               records_out ? (double)record_bytes_out / records_out : 0.0);
    printf("\n");
    return errors ? 1 : 0;
}

/* test_frame.c - the wire header: every field through encode and decode (the deadline budget_ms too), a peer of
 * another protocol version refused by name, and the budget a stage sees spent before it (frame_budget_spent). */
#include <string.h>

#include "check.h"
#include "wire/frame.h"

int main(void) {
    frame_header h = {.type = FRAME_FORWARD, .ring_id = 0x1122334455667788ULL, .step_id = 42, .flags = 7, .n_seqs = 2,
                      .payload_bytes = 4096, .budget_ms = 5250};
    h.seqs[0] = (frame_seq){.seq_id = 9, .pos = 100, .n_tokens = 3, .flags = FRAME_SEQ_VERIFY};
    h.seqs[1] = (frame_seq){.seq_id = 10, .pos = 7, .n_tokens = 1, .flags = FRAME_SEQ_NO_SAMPLE};
    uint8_t buf[1024];
    const size_t n = frame_header_size(2);
    frame_header_encode(&h, buf);
    frame_header d;
    rl_err err = {{0}};
    int rc = frame_header_decode(&d, buf, n, &err);
    CHECK(rc == 0 && d.type == h.type && d.ring_id == h.ring_id && d.step_id == 42 && d.flags == 7 && d.n_seqs == 2 &&
              d.payload_bytes == 4096 && d.budget_ms == 5250 && d.seqs[0].pos == 100 && d.seqs[1].seq_id == 10,
          "a header's fields, the deadline (budget_ms %u) too, come back as they were sent", d.budget_ms);
    buf[4] ^= 3; /* the version: another protocol's peer */
    rc = frame_header_decode(&d, buf, n, &err);
    CHECK(rc != 0 && strstr(err.msg, "protocol version mismatch"), "a peer of another version is refused by name (%s)", err.msg);
    buf[4] ^= 3;
    CHECK(frame_header_decode(&d, buf, n - 1, &err) != 0, "a header a byte short is refused (%s)", err.msg);

    /* Two earlier stages: 0.010 s and 0.250 s from receipt to send; here, received at 10.0, starting at 10.5. */
    frame_stamp st[2] = {{.t_recv = 1.000, .t_send = 1.010}, {.t_recv = 2.000, .t_send = 2.250}};
    double s = frame_budget_spent(st, 2, 10.0, 10.5);
    CHECK(s > 0.7599 && s < 0.7601, "the budget spent before a stage: 0.010 + 0.250 at the stages before it, 0.5 waiting here = 0.76 (%.4f)", s);
    st[1].t_send = 1.5; /* a clock that ran backwards counts nothing, never a negative */
    s = frame_budget_spent(st, 2, 10.0, 9.0);
    CHECK(s > 0.0099 && s < 0.0101, "a stamp or a wait that runs backwards counts 0 (%.4f)", s);
    return check_done();
}

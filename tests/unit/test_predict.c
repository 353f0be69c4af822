/* test_predict - fitting a node's figures to its stage's own timed frames (src/plan/predict.h,
 * predict_stage_calibrate), and the time to first token of stages that share a machine (predict_node.host), on a
 * hand-made model whose bytes and elements are known.
 *
 * The times the fit is given are computed here from predict.h's documented model on its own (a stage of t
 * tokens reads its dense weights min(t, col_reads) times and the experts it touches min(columns, col_reads)
 * times, at `speed`, and multiplies 2 t elements at `flops`), so the test checks that the fit recovers the
 * figures that produced them, not a copy of the fit. */
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "plan/predict.h"

#include "check.h"

/* One layer of a two-layer model: a dense matrix and a routed-expert tensor of E experts, f32. */
enum { D_ROWS = 64, D_COLS = 96, X_ROWS = 64, X_COLS = 32, E = 8, K = 2 };

static void fake_model(mf_model *m, mf_tensor *t, k3_hparams *hp) {
    memset(m, 0, sizeof *m);
    memset(t, 0, 2 * sizeof *t);
    t[0] = (mf_tensor){.name = "blk.0.attn_q.weight", .n_dims = 2, .ne = {D_COLS, D_ROWS, 1, 1},
                       .nbytes = (size_t)D_ROWS * D_COLS * 4};
    t[1] = (mf_tensor){.name = "blk.0.ffn_up_exps.weight", .n_dims = 3, .ne = {X_COLS, X_ROWS, E, 1},
                       .nbytes = (size_t)X_ROWS * X_COLS * E * 4};
    m->n_tensor = 2;
    m->tensors = t;
    memset(hp, 0, sizeof *hp);
    hp->n_layer = 2; /* the stage below is layer 0 only: no output head */
    hp->n_expert = E;
    hp->n_expert_used = K;
}

/* The documented model, recomputed: seconds for a stage of t tokens at (speed, flops, col_reads). */
static double model_time(double t, double speed, double flops, double r) {
    const double dense = (double)D_ROWS * D_COLS * 4, exps = (double)X_ROWS * X_COLS * E * 4;
    const double elems = (double)D_ROWS * D_COLS + (double)X_ROWS * X_COLS * E * K / E;
    const double touched = 1 - pow(1 - (double)K / E, t), cols = t * K / (E * touched);
    const double bytes = dense * fmin(t, r) + exps * touched * fmin(cols, r);
    return bytes / speed + 2 * t * elems / flops;
}

int main(void) {
    mf_model m;
    mf_tensor t[2];
    k3_hparams hp;
    fake_model(&m, t, &hp);
    plan_stage st = {.a = 0, .b = 1, .cached = 1.0};
    const double true_speed = 2.5e10, true_flops = 3e11;

    /* Two shapes (two one-token frames and a 64-token chunk, as a node times them): both figures back. */
    for (int cr = 1; cr <= 4; cr += 3) {
        double tok[3] = {1, 1, 64}, sec[3];
        for (int i = 0; i < 3; i++) sec[i] = model_time(tok[i], true_speed, true_flops, cr);
        predict_node nd = {.speed = 1e10, .flops = 1e12, .net = 1e9, .col_reads = cr};
        CHECK(predict_stage_calibrate(&m, &hp, &st, &nd, tok, sec, 3) == 0, "col_reads %d: the fit is made", cr);
        CHECK(fabs(nd.speed / true_speed - 1) < 1e-9 && fabs(nd.flops / true_flops - 1) < 1e-9,
              "col_reads %d: the figures that produced the times come back", cr);
        printf("col_reads %d: speed %.6g (want %.6g), flops %.6g (want %.6g)\n", cr, nd.speed, true_speed, nd.flops,
               true_flops);
    }

    /* Figures the node did not report (infinite compute, as the coordinator keeps a missing one) fit too. */
    {
        double tok[2] = {1, 32}, sec[2] = {model_time(1, true_speed, true_flops, 4), model_time(32, true_speed, true_flops, 4)};
        predict_node nd = {.speed = 1e10, .flops = INFINITY, .net = 1e9, .col_reads = 4};
        CHECK(predict_stage_calibrate(&m, &hp, &st, &nd, tok, sec, 2) == 0, "infinite compute: the fit is made");
        CHECK(isfinite(nd.flops) && fabs(nd.speed / true_speed - 1) < 1e-9 && fabs(nd.flops / true_flops - 1) < 1e-9,
              "... and finds both figures");
    }

    /* One shape only cannot tell reading from multiplying: one factor scales both, and the stage's predicted
     * time then equals the timed one. */
    {
        double tok[2] = {1, 1}, sec[2] = {0.010, 0.012};
        predict_node nd = {.speed = 1e10, .flops = 1e12, .net = 1e9, .col_reads = 4};
        CHECK(predict_stage_calibrate(&m, &hp, &st, &nd, tok, sec, 2) == 0, "one shape: the fit is made");
        CHECK(fabs(nd.speed / nd.flops / (1e10 / 1e12) - 1) < 1e-12, "... by one factor for both figures");
        const double got = model_time(1, nd.speed, nd.flops, 4);
        CHECK(got > 0.010 && got < 0.012, "... the prediction between the two timed frames (%.6f)", got);
        printf("one shape: predicted %.6f s between the timed 0.010 and 0.012\n", got);
    }

    /* Nothing to fit: a stage reading experts from disk (its frames time the disk), or a time that is not
     * positive; the figures stay as they were. */
    {
        double tok[2] = {1, 64}, sec[2] = {0.01, 0.3};
        predict_node nd = {.speed = 1e10, .flops = 1e12, .net = 1e9, .col_reads = 4};
        plan_stage disk = st;
        disk.cached = 0.5;
        CHECK(predict_stage_calibrate(&m, &hp, &disk, &nd, tok, sec, 2) == -1, "a stage reading experts from disk: no fit");
        CHECK(nd.speed == 1e10 && nd.flops == 1e12, "... the figures unchanged");
        sec[1] = 0;
        CHECK(predict_stage_calibrate(&m, &hp, &st, &nd, tok, sec, 2) == -1, "a time of 0: no fit");
        CHECK(nd.speed == 1e10 && nd.flops == 1e12, "... the figures unchanged");
        CHECK(predict_stage_calibrate(&m, &hp, &st, &nd, tok, sec, 0) == -1, "no frames: no fit");
    }

    /* A two-tier node (a device and RAM): the same two factors scale both tiers' figures. */
    {
        plan_stage two = st;
        two.dev_layers = 1, two.cpu_moe = 1; /* the layer on the device, its experts in RAM */
        predict_node nd = {.speed = 1e11, .flops = 1e13, .net = 1e9, .two_tier = true, .ram_speed = 1e10, .ram_flops = 1e12};
        double tok[3] = {1, 1, 64}, sec[3] = {0.004, 0.004, 0.05};
        CHECK(predict_stage_calibrate(&m, &hp, &two, &nd, tok, sec, 3) == 0, "two tiers: the fit is made");
        CHECK(fabs(nd.speed / nd.ram_speed - 10) < 1e-9 && fabs(nd.flops / nd.ram_flops - 10) < 1e-9,
              "... scaling both tiers alike");
    }
    /* A pipelined prompt on stages sharing one machine. Two stages of the same layer (time t per chunk at
     * their figures), no delays, a prompt of two chunks: on machines of their own stage 1 computes chunk 1
     * while stage 0 computes chunk 2, so the first token comes after 3 t; on one machine that computes one
     * stage at a time, after 4 t (every chunk on every stage, one after another); with room for two at once,
     * 3 t again. Three stages, three chunks: 5 t on machines of their own, 9 t one at a time, and 6 t two at
     * once: in the third t all three stages have a chunk, so one waits, and the last stage, which must take
     * the three chunks in turn, cannot then finish before 6 t whichever waits (worked by hand). */
    {
        const double t = model_time(64, true_speed, true_flops, 4);
        plan_result plan;
        memset(&plan, 0, sizeof plan);
        double hops[4] = {0, 0, 0, 0};
        predict_opts o = {.prompt = 128, .chunk = 64};
        struct { int stages, slots, host; uint32_t prompt; double want; } cases[] = {
            {2, 1, 0, 128, 3}, {2, 1, 1, 128, 4}, {2, 2, 1, 128, 3}, {2, 1, 1, 64, 2},
            {3, 1, 0, 192, 5}, {3, 1, 1, 192, 9}, {3, 2, 1, 192, 6}, {3, 3, 1, 192, 5},
        };
        for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) {
            plan.n_stages = cases[i].stages;
            predict_node nodes[3];
            for (int s = 0; s < plan.n_stages; s++) {
                plan.stages[s] = st;
                nodes[s] = (predict_node){.speed = true_speed, .flops = true_flops, .net = 1e12, .col_reads = 4,
                                     .host = cases[i].host, .host_slots = cases[i].slots};
            }
            o.prompt = cases[i].prompt;
            predict_result r;
            rl_err e;
            CHECK(predict_predict(&m, &hp, &plan, nodes, hops, &o, &r, &e) == 0, "%d stages: predicted", plan.n_stages);
            CHECK(fabs(r.ttft_s / (cases[i].want * t) - 1) < 1e-9, "%d stages, %u-token prompt in chunks of 64, %s: first "
                  "token after %.0f chunk times (got %.4f)", plan.n_stages, o.prompt,
                  cases[i].host ? (cases[i].slots == 1 ? "one machine, one at a time" : "one machine, several at once")
                                : "machines of their own", cases[i].want, r.ttft_s / t);
        }
    }
    return check_done();
}

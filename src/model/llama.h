/*
 * llama.h - the Llama 3 model: parameters, forward, backward, remat.
 *
 * Parameters, gradients live each in one contiguous float block; the tensor
 * table names every tensor as Hugging Face does (model.layers.N.self_attn.
 * q_proj.weight, ...) with its offset, so checkpoints, clipping and sharding
 * walk one list. Linear weights are stored (out, in) as in HF.
 *
 *   st_llama m = ST_LLAMA_INIT;
 *   st_llama_shape_from_config(&shape, &cfg);
 *   rc = st_llama_init(&m, &shape);             // params + grads
 *   st_llama_init_weights(&m, seed);
 *   rc = st_llama_alloc_acts(&m, B, T, ST_REMAT_FULL);
 *   st_llama_zero_grads(&m);
 *   rc = st_llama_forward_backward(&m, tokens, 1.0f / ntargets, &loss_sum);
 *   st_llama_release(&m);
 *
 * tokens are B rows of T+1 ids: inputs are the first T, targets the last T.
 * Activation memory per remat policy (per layer, N = B*T tokens):
 *   none    keeps every intermediate; backward recomputes nothing.
 *   minimal keeps the matrix-product outputs (q, k, v, o-proj residual, gate,
 *           up); recomputes norms, attention and the SwiGLU product.
 *   full    keeps only each layer's input; recomputes the whole layer.
 */
#ifndef ST_MODEL_LLAMA_H
#define ST_MODEL_LLAMA_H

#include <stdint.h>

#include "config/config.h"
#include "comm/comm.h"
#include "kernels/cpu/ops.h"
#include "model/kplan.h"

typedef struct st_llama_shape {
	int64_t V, E, L, H, K, D, M; /* vocab, emb, layers, q heads, kv heads, head_dim, mlp */
	float eps;
	double theta;
	st_rope_scaling rope;
} st_llama_shape;

enum st_tensor_kind { ST_T_EMBED, ST_T_NORM, ST_T_LINEAR };

/*
 * One tensor as this process holds it. Under tensor parallelism a process
 * holds a piece of the whole tensor: tp_dim is the dimension split across the
 * tensor-parallel group (0: rows, e.g. q_proj and lm_head; 1: columns, o_proj
 * and down_proj; -1: replicated, embeddings and norms), tp_offset the piece's
 * corner in the global tensor. shape and numel are the piece's.
 */
typedef struct st_tensor {
	char name[80];
	int64_t offset, numel;   /* within the process's parameter block */
	int ndim;
	int64_t shape[2];        /* piece shape (1-D: shape[1] == 0) */
	int64_t global_shape[2];
	int64_t tp_offset[2];
	int tp_dim;
	enum st_tensor_kind kind;
} st_tensor;

typedef struct st_layer_view {
	float *ln1, *wq, *wk, *wv, *wo, *ln2, *wg, *wu, *wd;
} st_layer_view;

typedef struct st_llama_view {
	float *embed, *norm, *lm_head;
	st_layer_view *layers; /* L entries */
} st_llama_view;

struct st_llama_acts;
struct st_llama;

/*
 * Where the weights come from when the model is not resident (FSDP, ZeRO-3):
 * the model works unit by unit (0 the embedding, 1..L the layers, L+1 the
 * final norm and output layer) and asks for each unit before using it.
 * acquire(u, 0): unit u's weights must be in m->p (st_llama_bind_unit).
 * acquire(u, 1): the same, plus zeroed gradient space in m->g.
 * grads_ready(u): unit u's gradients for this micro-batch are complete.
 */
typedef struct st_llama_hooks {
	int (*acquire)(void *ctx, struct st_llama *m, int unit, int for_backward);
	int (*grads_ready)(void *ctx, struct st_llama *m, int unit);
	/* Optional: the embedding without gathering its weights (unit 0 is then
	 * never acquired). embed_forward: x (n,E) = embedding rows of tokens;
	 * embed_backward: accumulate dx (n,E) into the embedding's gradient,
	 * complete for this micro-batch on return (no grads_ready(0)). */
	int (*embed_forward)(void *ctx, struct st_llama *m, const int32_t *tokens, int64_t n, float *x);
	int (*embed_backward)(void *ctx, struct st_llama *m, const int32_t *tokens, int64_t n, const float *dx);
	void *ctx;
} st_llama_hooks;

typedef struct st_llama {
	st_llama_shape s;  /* global shape */
	st_llama_shape ls; /* this process's shape: H, K, M and V (output layer) divided by tp */
	int tp, tp_rank;   /* tensor-parallel group size and position */
	st_comm *tp_comm;  /* NULL when tp == 1 */
	int64_t nparams;
	float *params, *grads;
	st_llama_view p, g;
	int ntensors;
	st_tensor *tensors;
	struct st_llama_acts *acts;
	const st_llama_hooks *hooks; /* NULL: resident weights and gradients */
	int bf16;                    /* matrix products with bf16 inputs (set before st_llama_alloc_acts) */
	uint16_t *wbf16;             /* bf16 copy of resident weights (st_llama_weights_changed) */
	st_kplan kplan;              /* bf16 mode: each site's kernel (st_llama_set_kernels; zero: all bf16) */
	int gfresh;                  /* resident gradients zeroed by st_llama_zero_grads but not yet
					written: the next backward writes them (products with beta 0)
					in place of adding to zeros */
} st_llama;

#define ST_LLAMA_INIT {0}

void st_llama_shape_from_config(st_llama_shape *s, const st_config *c);

/*
 * The model's tensor table, read without a model (nothing is allocated).
 * This is the one owner of the tensors' Hugging Face names, shapes and
 * tensor-parallel split rules: st_llama_init_tp builds each process's table
 * from it, and the parameter count, Hugging Face export/import and
 * `slicetrain plan` read it.
 *
 * Table order: embedding; per layer input_layernorm, q, k, v, o,
 * post_attention_layernorm, gate, up, down; final norm; output layer.
 * st_llama_tensor_at fills *t with tensor i (0 <= i < st_llama_num_tensors)
 * as one whole, unsplit tensor: name, kind, ndim, shape == global_shape,
 * numel (-1 if it overflows int64), tp_dim (the dimension a tensor-parallel
 * group splits, -1: replicated), offset and tp_offset 0.
 *
 *   for (int64_t i = 0; i < st_llama_num_tensors(&s); i++) {
 *           st_tensor t;
 *           st_llama_tensor_at(&s, i, &t);
 *           ... t.name, t.ndim, t.global_shape ...
 *   }
 */
/* Tensors of one decoder layer in the table (input_layernorm, q, k, v, o,
 * post_attention_layernorm, gate, up, down). */
enum { ST_LAYER_TENSORS = 9 };
int64_t st_llama_num_tensors(const st_llama_shape *s);
void st_llama_tensor_at(const st_llama_shape *s, int64_t i, st_tensor *t);
/* Number of parameters of a shape: the sum of the table's tensors (without
 * walking every layer); -1 if it overflows int64. */
int64_t st_llama_count_params(const st_llama_shape *s);
/*
 * The model-level check of a resolved config (those that need the tensor
 * table, which src/config cannot see): its parameter count fits int64.
 * ST_EINVAL "model NAME is too large: its parameter count overflows 64
 * bits" otherwise (exit status 2). *num_params (may be NULL): the count.
 * The trainer and `slicetrain plan` call it before sizing anything.
 */
int st_llama_check_config(const st_config *c, int64_t *num_params);
int st_llama_init(st_llama *m, const st_llama_shape *s);
/* Megatron-style tensor parallelism over a group of tp processes: q/k/v,
 * gate/up and the output layer split by rows (heads, mlp, vocab), o and down
 * by columns; activations all-reduced after o and down (and their gradients
 * before the norms' backward); a vocabulary-parallel cross-entropy. H, K, M
 * and V must divide by tp (ST_EINVAL otherwise). */
int st_llama_init_tp(st_llama *m, const st_llama_shape *s, int tp, int tp_rank, st_comm *tp_comm,
		     int resident);
/* resident = 0: params and grads are not allocated (NULL); set m->hooks,
 * which bind each unit's weights and gradients to buffers of their own. */

/* Unit u's tensors: table indices [*t0, *t0 + *nt). */
void st_llama_unit(const st_llama *m, int u, int *t0, int *nt);
/* Elements of unit u (its tensors are contiguous in the table layout). */
int64_t st_llama_unit_numel(const st_llama *m, int u);
/* Point unit u's weight views at p and gradient views at g (NULL: leave),
 * both laid out as the unit's tensors end to end. */
void st_llama_bind_unit(st_llama *m, int u, float *p, float *g);
/* Initial values of rows [row0, row0+rows) of tensor i's piece into dst. */
void st_llama_init_rows(const st_llama *m, uint64_t seed, int i, int64_t row0, int64_t rows, float *dst);
/* Embedding ~ N(0,1); linear weights ~ N(0, 1/fan_in); norms = 1. Each element
 * is a function of (seed, tensor index, element index in the global tensor)
 * only, so every mesh starts from the same weights. */
void st_llama_init_weights(st_llama *m, uint64_t seed);
/* Activation buffers for micro-batches of B x T under a remat policy, the
 * kernels' workspace (attention's K/V layouts and per-thread tiles, the
 * RMSNorm backward partial sums) and the matrix products' kernel context
 * (kernels/cpu/kctx.h: their scratch for this CPU and the model's product
 * shapes, and their primitive table), allocated once here and passed to
 * every kernel call. The per-thread slices are sized for
 * omp_get_max_threads() at this call (OMP_NUM_THREADS, omp_set_num_threads):
 * the kernels then run on at most that many threads. The products' back
 * ends (st_gemm_set_f32_backend, st_amx_set_enabled) must be set before:
 * the context is sized for those in force. */
int st_llama_alloc_acts(st_llama *m, int64_t B, int64_t T, enum st_remat policy);
/* The gradients to zero. Resident ones without hooks are not cleared here:
 * the next st_llama_forward_backward writes each one (its first product
 * with beta 0; the embedding's and the norms' cleared first) instead of
 * adding to zeros; until it returns they are not to be read. */
void st_llama_zero_grads(st_llama *m);
/* loss_sum += sum of token losses; grads += loss_scale * d(loss_sum)/dparams. */
int st_llama_forward_backward(st_llama *m, const int32_t *tokens, float loss_scale,
			      double *loss_sum);
/* Forward only: loss_sum += sum of token losses. */
int st_llama_forward_loss(st_llama *m, const int32_t *tokens, double *loss_sum);
/* Bytes of activation memory allocated by st_llama_alloc_acts. */
int64_t st_llama_act_bytes(const st_llama *m);
/* What st_llama_alloc_acts allocates beyond the shape, batch and policy. */
typedef struct st_llama_act_opts {
	int tp;                    /* tensor-parallel group size (partial-sum buffers when > 1) */
	int bf16;                  /* bf16 mode: product inputs stored in bf16 */
	int64_t weight_copy_elems; /* bf16 mode with weights not resident: the largest linear tensor */
	int threads;               /* OpenMP threads of the kernels' workspace; 0: omp_get_max_threads() */
	const st_kplan *kplan;     /* bf16 mode: the plan, for its fp32 kernels' operand copies (NULL: all bf16) */
	int any_plan;              /* bf16 mode, the plan not decided yet (bf16_kernels auto): the
				      most any plan takes; kplan is then not read */
} st_llama_act_opts;
/* The same figure computed without allocating (for planning), from the same
 * layout code; o NULL: one process, fp32. s is the process's shape
 * (st_llama.ls: heads, mlp and vocabulary divided by tp). */
int64_t st_llama_act_bytes_for(const st_llama_shape *s, int64_t B, int64_t T, enum st_remat policy,
			       const st_llama_act_opts *o);
/* Bytes of the kernels' workspace st_llama_alloc_acts allocates (not
 * counted in st_llama_act_bytes), and the same figure for planning, from
 * the same layout code (o->threads 0 or o NULL: this process's
 * omp_get_max_threads()). */
int64_t st_llama_workspace_bytes(const st_llama *m);
int64_t st_llama_workspace_bytes_for(const st_llama_shape *s, int64_t B, int64_t T,
				     enum st_remat policy, const st_llama_act_opts *o);
/* Bytes of the products' kernel context st_llama_alloc_acts allocates
 * (counted in neither figure above), and the same figure for planning,
 * from the same layout code, for this CPU (threads as above). */
int64_t st_llama_kctx_bytes(const st_llama *m);
int64_t st_llama_kctx_bytes_for(const st_llama_shape *s, int64_t B, int64_t T, enum st_remat policy,
				const st_llama_act_opts *o);
const st_tensor *st_llama_find(const st_llama *m, const char *name);
/* Elements of the largest matrix-product weight (linear tensor) of this process. */
int64_t st_llama_largest_linear(const st_llama *m);
/* The resident weights changed (optimizer step, restore): refresh their bf16
 * copy, which bf16 products then read instead of converting each time. */
int st_llama_weights_changed(st_llama *m);
/* The bf16 copy itself (allocated on first use), for an optimizer that
 * writes it while updating the weights; *out NULL when there is none (fp32,
 * or weights not resident). */
int st_llama_bf16_weights(st_llama *m, uint16_t **out);
/*
 * bf16 mode: run each product site and attention pass on the kernel plan p
 * names (model/kplan.h). Reallocates the activations (laid out for the
 * plan) when the plan changes, and makes or frees the weights' bf16 copy as
 * the plan needs it. Every process of a group must use the same plan.
 */
int st_llama_set_kernels(st_llama *m, const st_kplan *p);
/* The shape a plan for micro-batches of B x T is timed at (kplan.h). */
void st_llama_kernel_shape(const st_llama *m, int64_t B, int64_t T, st_kshape *out);

void st_llama_release(st_llama *m);

#endif

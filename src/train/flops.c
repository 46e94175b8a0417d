#include "train/flops.h"

st_flops st_training_flops(const st_config *c, double batch)
{
	double B = batch, T = (double)c->max_target_length, E = (double)c->emb_dim;
	double M = (double)c->mlp_dim, H = (double)c->num_query_heads, K = (double)c->num_kv_heads;
	double D = (double)c->head_dim, V = (double)c->vocab_size, L = (double)c->num_decoder_layers;
	double ffn1 = 2 * B * T * M * E * 2; /* gate and up: mlp_activations ["silu","linear"] */
	double ffn2 = 2 * B * T * M * E;
	double qkv = 2 * B * T * E * (H + 2 * K) * D;
	double proj = 2 * B * T * E * H * D;
	double emb = 2 * B * T * E * V;
	double causal_attn = 4 * B * T * T * H * D / 2;
	st_flops f;
	double accum = (double)c->gradient_accumulation_steps;
	f.weights = ((ffn1 + ffn2 + qkv + proj) * L + emb) * 3 * accum;
	f.attention = causal_attn * L * 3 * accum;
	f.total = f.weights + f.attention;
	return f;
}

/*
 * plan.c - slicetrain plan CONFIG.yml [key=value ...] [--num-slices S]
 * [--devices-per-slice D] [--memory GiB] [--json]: the command line of
 * st_plan_compute, st_plan_suggest and st_plan_print (src/train/plan.h).
 */
#include "cli/cli.h"

#include <stdio.h>
#include <stdlib.h>

#include "base/err.h"
#include "config/config.h"
#include "train/plan.h"

static const char plan_usage[] =
	"usage: slicetrain plan CONFIG.yml [key=value ...] [--num-slices S] [--devices-per-slice D]\n"
	"                       [--memory GiB] [--json]\n"
	"\n"
	"Prints what one device of the run needs, without running it: parameter count,\n"
	"per-device bytes of weights, gradients, AdamW state and activations under the\n"
	"config's remat_policy and mesh (the parallelism keys resolved for S slices of D\n"
	"devices, as MaxText), FLOPs per device per step (MaxText's formula), and whether\n"
	"it fits in --memory GiB (default: this machine's RAM). The sharding model is\n"
	"documented in docs/performance.md.\n"
	"Defaults: S = num_slices when set, else 1; D = the product of the ici_* values\n"
	"when none is -1, else 1.\n"
	"\n"
	"When it does not fit, the report ends with a variant that does and asks least\n"
	"of the user (the overrides and options to add), tried among: remat_policy=full,\n"
	"the data axes folded into fsdp, a smaller per_device_batch_size with more\n"
	"gradient accumulation (the same global batch), dtype=bfloat16, and up to 16x\n"
	"the devices per slice as fsdp; or says that none of them fits.\n"
	"\n"
	"Exit status: 0 it fits, 1 it does not fit (the report printed all the same),\n"
	"2 bad input.\n"
	"\n"
	"example (the tutorial's 70B run, on chips of 95 GiB):\n"
	"  slicetrain plan configs/base.yml model_name=llama3-70b per_device_batch_size=2 \\\n"
	"      max_target_length=4096 remat_policy=full ici_tensor_parallelism=4 \\\n"
	"      ici_fsdp_parallelism=4 dcn_fsdp_parallelism=2 dcn_data_parallelism=1 \\\n"
	"      --num-slices 2 --devices-per-slice 16 --memory 95\n";

/* The usage's defaults for S and D (0: not given on the command line). */
static void default_mesh(const st_config *c, int64_t *slices, int64_t *dps)
{
	if (!*slices)
		*slices = c->num_slices > 0 ? c->num_slices : 1;
	if (!*dps) {
		int64_t ici[3] = {c->ici_data_parallelism, c->ici_fsdp_parallelism, c->ici_tensor_parallelism};
		*dps = 1;
		for (int i = 0; i < 3; i++)
			*dps *= ici[i] > 0 ? ici[i] : 1;
		for (int i = 0; i < 3; i++)
			if (ici[i] == -1)
				*dps = 1;
	}
}

int st_cmd_plan(int argc, char **argv)
{
	if (argc > 0 && st_cli_is_help(argv[0])) {
		fputs(plan_usage, stdout);
		return 0;
	}
	st_cli_use_config_dir();
	int64_t slices = 0, dps = 0;
	double memory = 0;
	int json = 0, fits = 0;
	const st_cli_opt opts[] = {
		{.name = "--num-slices", .kind = ST_CLI_COUNT, .value = &slices},
		{.name = "--devices-per-slice", .kind = ST_CLI_COUNT, .value = &dps},
		{.name = "--memory", .kind = ST_CLI_GIB, .value = &memory},
		{.name = "--json", .kind = ST_CLI_FLAG, .value = &json},
		{0},
	};
	st_cli_config_args a = ST_CLI_CONFIG_ARGS_INIT;
	st_config *c = calloc(1, sizeof(*c));
	int rc = c ? st_cli_config_args_parse(&a, argc, argv, opts, "plan", ST_CLI_NEED_CONFIG)
		   : st_fail(ST_ENOMEM, "out of memory");
	if (rc == 0)
		rc = st_config_load(c, a.config, a.nkv, a.kv);
	if (rc == 0) {
		default_mesh(c, &slices, &dps);
		st_plan p;
		st_plan_suggestion s;
		rc = st_plan_compute(&p, c, slices, dps, memory);
		if (rc == 0 && (rc = st_plan_suggest(&p, c, memory, &s)) >= 0) {
			if (json)
				st_plan_print_json(&p, c, &s, stdout);
			else
				st_plan_print(&p, c, &s, stdout);
			fflush(stdout);
			fits = p.fits;
			rc = 0;
		}
	}
	st_cli_config_args_release(&a);
	free(c);
	if (rc < 0) {
		fprintf(stderr, "slicetrain: error: %s\n", st_errmsg());
		return st_exit_status(rc);
	}
	return fits ? 0 : 1; /* a check that failed, as test(1): the report says what would fit */
}

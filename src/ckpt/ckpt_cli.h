/*
 * ckpt_cli.h - the checkpoint subcommands, called by main:
 *
 *   slicetrain export CHECKPOINT_DIR OUT_DIR [--shard-size SIZE]
 *   slicetrain ckpt list DIR
 *   slicetrain ckpt verify DIR
 *
 * Each takes the arguments after its command name and returns the process
 * exit status: 0 done, 1 failure (a damaged checkpoint, I/O), 2 bad input
 * (one "slicetrain: error:" line says what).
 */
#ifndef ST_CKPT_CKPT_CLI_H
#define ST_CKPT_CKPT_CLI_H

int st_ckpt_cmd_export(int argc, char **argv);
int st_ckpt_cmd_ckpt(int argc, char **argv);

extern const char st_ckpt_export_usage[];
extern const char st_ckpt_ckpt_usage[];

#endif

/*
 * tfevents.h - TensorBoard event files: scalars and text summaries, in the
 * format TensorFlow, tensorboardX and PyTorch write and TensorBoard reads.
 *
 *   st_tfevents *w;
 *   rc = st_tfevents_open(&w, "out/run/tensorboard");   // mkdir -p, new file
 *   rc = st_tfevents_scalar(w, step, "loss", loss);
 *   rc = st_tfevents_text(w, step, "run/start", "...");
 *   rc = st_tfevents_flush(w);       // the records added so far, in one write(2)
 *   rc = st_tfevents_close(w);       // flush and close; NULL is fine
 *
 * A file is a sequence of TFRecords, each
 *   uint64 length (little-endian), uint32 masked_crc32c(length bytes),
 *   length bytes of a serialized tensorflow.Event, uint32 masked_crc32c(data)
 * where masked_crc32c(x) = rotate_right(crc32c(x), 15) + 0xa282ead8. The
 * first record is Event{wall_time, file_version: "brain.Event:2"}. A scalar
 * is Event{wall_time, step, summary{value{tag, simple_value}}} (float32, as
 * tensorboardX's add_scalar and tf.compat.v1 write it); a text summary is
 * Event{..., summary{value{tag, tensor: DT_STRING scalar, metadata:
 * plugin "text"}}} (tf.summary.text). Fields are written in field-number
 * order, so a record is byte for byte what Python's protobuf serializes.
 *
 * The file is <dir>/events.out.tfevents.<seconds, 10 digits>.<host>.<pid>.<n>
 * (PyTorch's SummaryWriter's name; n counts this process's writers).
 * TensorBoard reads the event files of a directory in the sorted order of
 * their names and takes a step that goes backwards for a restart, so a new
 * file must sort after the ones already there: when one of them carries
 * the same or a later second, the new name takes the largest second found
 * plus one.
 *
 * Errors: ST_EIO naming the path and strerror (a directory that cannot be
 * created or written, a failed write); ST_EINVAL for an empty directory name
 * or a path too long; ST_ENOMEM. Failures are sticky: after one, every call
 * but close returns the same error. Not thread-safe: one writer, one thread.
 */
#ifndef ST_BASE_TFEVENTS_H
#define ST_BASE_TFEVENTS_H

#include <stddef.h>
#include <stdint.h>

typedef struct st_tfevents st_tfevents;

int st_tfevents_open(st_tfevents **out, const char *dir);
/* The file's path (valid until close). */
const char *st_tfevents_path(const st_tfevents *w);
/* Append a record (written by the next flush); value is stored as float32. */
int st_tfevents_scalar(st_tfevents *w, int64_t step, const char *tag, double value);
/* text: UTF-8, any length; shown as markdown by TensorBoard's text dashboard. */
int st_tfevents_text(st_tfevents *w, int64_t step, const char *tag, const char *text);
int st_tfevents_flush(st_tfevents *w);
/* Flush, then close: 0, or the first error the writer met. */
int st_tfevents_close(st_tfevents *w);

/* ---- the encoding, for tests ---- */

/* rotate_right(crc, 15) + 0xa282ead8 (TFRecord's masked CRC). */
uint32_t st_tfrecord_mask_crc(uint32_t crc);
/* The framed record of data[0..n): 16 + n bytes written to out. */
size_t st_tfrecord_frame(unsigned char *out, const void *data, size_t n);
/* Serialized Events (not framed) into out[0..cap): their length, or the
 * length needed when it is more than cap (out then holds nothing useful). */
size_t st_tfevent_encode_version(unsigned char *out, size_t cap, double wall_time);
size_t st_tfevent_encode_scalar(unsigned char *out, size_t cap, double wall_time, int64_t step, const char *tag,
				float value);
size_t st_tfevent_encode_text(unsigned char *out, size_t cap, double wall_time, int64_t step, const char *tag,
			      const char *text);

#endif
